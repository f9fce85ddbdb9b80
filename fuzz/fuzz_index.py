"""Fuzz target: index files (magic, checksum, pack map, entries).

The first byte picks the mode: even -> ``index.decode`` on the rest as is; odd -> the rest is an
index body and the target adds magic and a valid checksum first, so the fuzzer gets past the
checksum to the schema checks.
"""

from __future__ import annotations

import struct

import xxhash

import _harness
from deltackpt.format import index


def TestOneInput(data: bytes) -> None:
    if not data:
        return
    body = data[1:]
    if data[0] % 2:
        body = index.MAGIC + body + struct.pack("<Q", xxhash.xxh64_intdigest(body))
    out = _harness.expect_typed(index.decode, body)
    for _pid, (plen, entries) in (out or {}).items():
        for e in entries:
            assert e.offset + e.length <= plen


if __name__ == "__main__":
    _harness.main(TestOneInput)
