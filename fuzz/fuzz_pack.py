"""Fuzz target: the pack reader (magic, trailer, header checksum, entries) and PackEntry.from_list.

The first byte picks the mode: even -> ``parse_pack`` on the rest; odd -> the rest is a msgpack
entry list fed to ``PackEntry.from_list`` against a pack length taken from the data (this skips
the checksum, so the fuzzer reaches the entry checks directly).
"""

from __future__ import annotations

import _harness
from deltackpt.format import msgpack_io, pack
from deltackpt.format.limits import MAX_PACK_HEADER_BYTES


def _entries(body: bytes) -> None:
    items = msgpack_io.unpack(body, what="fuzz header", max_bytes=MAX_PACK_HEADER_BYTES)
    if not isinstance(items, list):
        return
    plen = len(body) * 64
    for i, item in enumerate(items):
        e = pack.PackEntry.from_list(item, what=f"entry {i}", pack_len=plen)
        assert len(pack.MAGIC) <= e.offset and e.offset + e.length <= plen - pack.TRAILER_BYTES


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    body = data[1:]
    if data[0] % 2 == 0:
        entries = _harness.expect_typed(pack.parse_pack, body)
        for e in entries or ():
            assert 0 < e.offset and e.offset + e.length <= len(body)
    else:
        _harness.expect_typed(_entries, body)


if __name__ == "__main__":
    _harness.main(TestOneInput)
