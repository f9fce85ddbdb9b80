"""What one chunk costs each codec, counted rather than timed: Python function calls, calls into C
(numpy, zstd) by name, and the bytes allocated at peak beyond the input and the destination.

The chunk is 2 MiB of float32 shaped like trained weights (normal, std 0.02) and its next version
(a small step on every element), so that the exponent plane compresses and the mantissa planes do
not, as in the real states.  tests/codecs/test_codec_costs.py keeps the structural counts as checks.
"""

from __future__ import annotations

import collections
import sys
import tracemalloc
from typing import Any, Callable

import numpy as np

from deltackpt.codecs.base import ChunkContext
from deltackpt.codecs.registry import BG_ZSTD, SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA, get

CTX = ChunkContext("float32", 4, 4 * 256, 1)


def sample_chunks(nbytes: int = 2 << 20, seed: int = 0) -> tuple[bytes, bytes]:
    """(new, base): float32 weights and their previous version, one small step apart."""
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal(nbytes // 4) * 0.02).astype(np.float32)
    new = base + (rng.standard_normal(len(base)) * 1e-5).astype(np.float32)
    return new.tobytes(), base.tobytes()


def calls(f: Callable[[], Any]) -> tuple[int, collections.Counter]:
    """(Python calls, Counter of C calls by name) made while ``f`` runs, in this thread."""
    py = 0
    c_calls: collections.Counter = collections.Counter()

    def prof(frame: Any, event: str, arg: Any) -> None:
        nonlocal py
        if event == "call":
            py += 1
        elif event == "c_call":
            c_calls[getattr(arg, "__name__", repr(arg))] += 1
    sys.setprofile(prof)
    try:
        f()
    finally:
        sys.setprofile(None)
    return py, c_calls


def peak_bytes(f: Callable[[], Any]) -> int:
    """Bytes allocated at peak while ``f`` runs (Python objects and numpy buffers), over what was
    live before it; what ``f`` returns counts too."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        keep = f()
        peak = tracemalloc.get_traced_memory()[1]
        del keep
    finally:
        tracemalloc.stop()
    return peak - before


def costs(eid: int, new: bytes, base: bytes | None) -> dict[str, Any]:
    """Counts for encoding ``new`` with codec ``eid`` and decoding it into a destination, warmed up
    (thread-local buffers exist) as they are in a save or a load of many chunks."""
    codec = get(eid)
    enc = codec.encode(new, CTX, base)
    assert enc is not None
    payload = bytes(enc.payload)
    out = memoryview(bytearray(len(new)))
    base_arg = base if codec.needs_base else None
    codec.decode_into(out, enc.params, payload, base_arg)
    assert bytes(out) == new
    py_e, c_e = calls(lambda: codec.encode(new, CTX, base))
    py_d, c_d = calls(lambda: codec.decode_into(out, enc.params, payload, base_arg))
    return {"encode python calls": py_e, "encode C calls": sum(c_e.values()), "encode C by name": dict(c_e),
            "decode python calls": py_d, "decode C calls": sum(c_d.values()), "decode C by name": dict(c_d),
            "encode peak bytes / chunk": peak_bytes(lambda: codec.encode(new, CTX, base)) / len(new),
            "decode peak bytes / chunk": peak_bytes(lambda: codec.decode_into(out, enc.params, payload, base_arg))
            / len(new), "stored / raw": len(payload) / len(new)}


def counts() -> dict[str, Any]:
    new, base = sample_chunks()
    rows = {"bg-zstd": costs(BG_ZSTD, new, None)}
    for name, eid in (("xor-delta", XOR_DELTA), ("sub-delta", SUB_DELTA)):
        rows[name] = costs(eid, new, base)
    decayed = np.frombuffer(base, np.float32) * np.float32(0.9)   # an Adam moment where no gradient came
    decayed[::3] += np.frombuffer(new, np.float32)[::3] * np.float32(0.1)
    rows["scaled-delta"] = costs(SCALED_DELTA, decayed.tobytes(), base)
    sparse_new = bytearray(base)
    sparse_new[4096:8192] = new[4096:8192]   # four rows of 256 floats changed
    rows["sparse"] = costs(SPARSE, bytes(sparse_new), base)
    return rows
