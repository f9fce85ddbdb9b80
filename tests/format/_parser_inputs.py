"""Small valid inputs the format parser tests break in one place each."""

from __future__ import annotations

from deltackpt.format import objects, pack

CID = bytes(range(16))
CID2 = bytes(range(1, 17))


def _raw_object(payload: bytes = b"abcd") -> bytes:
    return objects.EncodedObject(0, len(payload), {}, payload).to_bytes()


def _pack(n: int = 2) -> bytes:
    b = pack.PackBuilder()
    for i in range(n):
        b.add(bytes([i]) * 16, _raw_object(bytes([i]) * 4), encoding=0, raw_len=4, base=None, depth=0)
    return b.finish()
