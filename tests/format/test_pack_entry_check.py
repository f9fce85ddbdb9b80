"""Pack and index entries are schema-checked on a fast path (opening a repository decodes every
entry of its index): it must accept exactly what the checked path accepts, with the same fields,
and leave everything else to the checked path, which names what is wrong."""

from __future__ import annotations

import random

import pytest

from deltackpt.errors import CorruptObjectError
from deltackpt.format.limits import MAX_CHAIN_DEPTH, MAX_CHUNK_BYTES, MAX_PACK_BYTES
from deltackpt.format.pack import MAGIC, TRAILER_BYTES, PackEntry

_ODD = [None, True, False, -1, 0, 1, 11, 12, 255, 256, 2.0, "x", b"", bytearray(16), b"\x01" * 16, b"\x02" * 15,
        b"\x03" * 17, MAX_PACK_BYTES, MAX_PACK_BYTES + 1, MAX_CHUNK_BYTES, MAX_CHUNK_BYTES * 2,
        MAX_CHUNK_BYTES * 2 + 1, MAX_CHAIN_DEPTH, MAX_CHAIN_DEPTH + 1, 1 << 70, [], {}]


def _outcome(fn, item, pack_len):
    try:
        return fn(item, what="t", pack_len=pack_len)
    except CorruptObjectError:
        return "refused"


@pytest.mark.parametrize("seed", range(4))
def test_the_fast_path_accepts_what_the_checked_path_accepts(seed):
    rng = random.Random(seed)
    checked = PackEntry._checked
    accepted = refused = 0
    for _ in range(5000):
        base = rng.choice([None, b"\x05" * 16])
        item = [b"\x04" * 16, rng.randrange(len(MAGIC), 1 << 20), rng.randrange(12, 1 << 16), rng.randrange(256),
                rng.randrange(1 << 21), base, 0 if base is None else rng.randrange(1, MAX_CHAIN_DEPTH + 1)]
        for _ in range(rng.randrange(0, 3)):   # spoil up to two fields
            item[rng.randrange(7)] = rng.choice(_ODD)
        if rng.random() < 0.05:
            item = rng.choice([item[:6], item + [0], tuple(item), None])
        pack_len = rng.choice([None, 1 << 21, len(MAGIC) + TRAILER_BYTES + rng.randrange(1 << 20)])
        fast, slow = _outcome(PackEntry.from_list, item, pack_len), _outcome(checked, item, pack_len)
        assert fast == slow and type(fast) is type(slow), (item, pack_len, fast, slow)
        if isinstance(fast, PackEntry):
            accepted += 1
            assert [type(v) for v in fast] == [type(v) for v in slow]
        else:
            refused += 1
    assert accepted > 500 and refused > 500
