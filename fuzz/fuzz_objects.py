"""Fuzz target: the object header parser and every codec's decoder, with a fuzzed base.

Input layout: FLAGS(u8) || object bytes.  FLAGS bit 0: give delta codecs a base chunk of exactly
``raw_len`` bytes (derived from the input, so the fuzzer controls it); bit 1: decode the payload
with every registered codec, not only the one the header names (reaches each decoder's checks
with any parameters).  Bits 2-3 pick the base's byte pattern.  Bit 4: also decode straight into
a destination buffer (``decode_into``, the path restores take).
"""

from __future__ import annotations

import _harness
from deltackpt.codecs import registry
from deltackpt.format import objects

_MAX_BASE = 1 << 20  # larger bases only slow the fuzzer; size checks fire before any use of them


def _base(flags: int, seed: bytes, raw_len: int) -> bytes | None:
    if not flags & 1 or raw_len > _MAX_BASE:
        return None
    pattern = (flags >> 2) & 3
    if pattern == 0 or not seed:
        return bytes(raw_len)
    if pattern == 1:
        return (seed * (raw_len // len(seed) + 1))[:raw_len]
    if pattern == 2:
        return bytes((i * 131 + 7) & 0xFF for i in range(min(raw_len, 4096))) * (raw_len // 4096) + \
            bytes((i * 131 + 7) & 0xFF for i in range(raw_len % 4096))
    return b"\x00\x00\x80\x3f" * (raw_len // 4) + b"\x00" * (raw_len % 4)  # float32 1.0, little-endian


def _decode(codec, obj, base):
    out = codec.decode(obj.params, obj.payload, obj.raw_len, base)
    assert memoryview(out).nbytes == obj.raw_len, (codec.name, memoryview(out).nbytes, obj.raw_len)
    return out


def _decode_into(codec, obj, base):
    out = bytearray(obj.raw_len)
    codec.decode_into(memoryview(out), obj.params, obj.payload, base)


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    flags, body = data[0], data[1:]
    obj = _harness.expect_typed(objects.parse, body)
    if obj is None:
        return
    base = _base(flags, bytes(obj.payload[:64]), obj.raw_len)
    codecs = registry.all_codecs() if flags & 2 else [_harness.expect_typed(registry.get, obj.encoding)]
    for codec in codecs:
        if codec is not None:
            _harness.expect_typed(_decode, codec, obj, base)
            if flags & 0x10 and obj.raw_len <= _MAX_BASE:
                _harness.expect_typed(_decode_into, codec, obj, base)


if __name__ == "__main__":
    _harness.main(TestOneInput)
