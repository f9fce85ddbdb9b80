"""Fuzz target: index files of both versions (magic, checksum, pack map or pack table, entries).

The first byte picks the mode, by its value mod 4: 0 -> ``index.decode`` on the rest as is;
1 -> the rest is a version-1 body, 2 -> a version-2 body: the target adds that version's magic and
a valid checksum first, so the fuzzer gets past the checksum to the schema checks; 3 ->
``index.decode_any`` on the rest as is, and every entry a version-2 file holds is found again by
looking its chunk up.
"""

from __future__ import annotations

import struct

import xxhash

import _harness
from deltackpt.format import index
from deltackpt.format.index_table import IndexTable


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    body, mode = data[1:], data[0] % 4
    if mode in (1, 2):
        magic = index.MAGIC if mode == 1 else index.MAGIC_V2
        body = magic + body + struct.pack("<Q", xxhash.xxh64_intdigest(body))
    if mode == 3:
        table = _harness.expect_typed(index.decode_any, body)
        if isinstance(table, IndexTable):
            for pid, (_plen, entries) in table.packs().items():
                found: dict = {e.chunk_id: [] for e in entries}
                table.lookup(list(found), found)
                assert all((pid, e) in found[e.chunk_id] for e in entries)
        return
    out = _harness.expect_typed(index.decode, body)
    for _pid, (plen, entries) in (out or {}).items():
        for e in entries:
            assert 8 <= e.offset and e.offset + e.length <= plen - 20


if __name__ == "__main__":
    _harness.main(TestOneInput)
