"""Byte planes: decoding inverts grouping bit for bit at every word width, whatever work buffers the
decoding thread reuses from call to call."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from deltackpt.codecs import bytegroup


def _payload(rng: np.random.Generator, width: int, n: int, kind: str) -> bytes:
    if kind == "noise":
        return rng.integers(0, 256, n * width, dtype=np.uint8).tobytes()
    # float-like words: a few distinct high bytes (a compressible plane), noisy low bytes
    words = rng.integers(0, 256, (n, width), dtype=np.uint8)
    words[:, -1] = rng.choice(np.array([0x3C, 0x3D, 0xBC, 0xBD], dtype=np.uint8), n)
    return words.tobytes()


@settings(max_examples=40, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 5, 8]), st.integers(0, 70_000),
                                st.sampled_from(["noise", "floats"]), st.booleans()), min_size=1, max_size=5),
       seed=st.integers(0, 2**32 - 1))
def test_planes_decode_to_the_original_bytes_at_every_width(calls, seed):
    """decode_planes returns exactly the bytes encode_planes grouped, for 1- to 8-byte words (2, 4
    and 8 merge planes into words, other widths copy each plane to its column), with raw and
    compressed planes, into a fresh array or a given one, call after call in one thread whose work
    buffers were sized by earlier calls."""
    rng = np.random.default_rng(seed)
    for width, n, kind, given_out in calls:
        raw = _payload(rng, width, n, kind)
        params, payload = bytegroup.encode_planes(raw, width, 1)
        out = np.full(len(raw), 0xA5, dtype=np.uint8) if given_out else None
        got = bytegroup.decode_planes(params, bytes(payload), len(raw), what="test", out=out)
        assert got.tobytes() == raw
        if given_out:
            assert got is out
