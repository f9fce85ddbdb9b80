"""What decoding one chunk costs, counted (bench/DELTAS.md "Speed" has the figures): no chunk-sized
allocation in any lossless decode once a thread has decoded a chunk, one native call for a
keyframe's planes, and a number of Python calls that does not grow with the chunk."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

from deltackpt.codecs import native_planes
from deltackpt.codecs.base import ChunkContext
from deltackpt.codecs.registry import BG_ZSTD, SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA, get

CHUNK = 2 << 20
CTX = ChunkContext("float32", 4, 1024, 1)


def _chunks(nbytes: int = CHUNK) -> dict[int, tuple[bytes, bytes | None]]:
    """A (new, base) pair per codec, shaped like training states: weights one small step apart,
    an Adam moment decayed where no gradient came, an embedding table with four rows changed."""
    rng = np.random.default_rng(0)
    base = (rng.standard_normal(nbytes // 4) * 0.02).astype(np.float32)
    new = base + (rng.standard_normal(len(base)) * 1e-5).astype(np.float32)
    decayed = base * np.float32(0.9)
    decayed[::3] += new[::3] * np.float32(0.1)
    rows = base.copy()
    rows[1024:2048] = new[1024:2048]
    return {BG_ZSTD: (new.tobytes(), None), XOR_DELTA: (new.tobytes(), base.tobytes()),
            SUB_DELTA: (new.tobytes(), base.tobytes()), SCALED_DELTA: (decayed.tobytes(), base.tobytes()),
            SPARSE: (rows.tobytes(), base.tobytes())}


def _peak(f) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        f()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def _calls(f) -> tuple[int, dict[str, int]]:
    """(Python-level calls, C calls by name) while ``f`` runs.  The cyclic collector is kept out
    of the count: a collection inside it runs the finalizers of earlier tests' objects, Python
    calls that are not the decode's (the full suite once counted 26 against 24)."""
    py, c = 0, {}

    def prof(frame, event, arg):
        nonlocal py
        if event == "call":
            py += 1
        elif event == "c_call":
            c[arg.__name__] = c.get(arg.__name__, 0) + 1
    gc.collect()
    gc.disable()
    sys.setprofile(prof)
    try:
        f()
    finally:
        sys.setprofile(None)
        gc.enable()
    return py, c


@pytest.mark.parametrize("eid", [BG_ZSTD, XOR_DELTA, SUB_DELTA, SCALED_DELTA, SPARSE])
def test_decoding_into_a_destination_allocates_nothing_chunk_sized(eid):
    """decode_into (a restore) and apply_into (a chain link over its base) reuse the thread's
    buffers: the peak of everything allocated while decoding stays under 1/16 of the chunk."""
    new, base = _chunks()[eid]
    codec = get(eid)
    enc = codec.encode(new, CTX, base)
    assert enc is not None
    payload = bytes(enc.payload)
    out = bytearray(len(new))
    codec.decode_into(memoryview(out), enc.params, payload, base)  # warms this thread's buffers
    assert bytes(out) == new
    assert _peak(lambda: codec.decode_into(memoryview(out), enc.params, payload, base)) < CHUNK / 16
    if codec.needs_base:
        held = bytearray(base)
        codec.apply_into(memoryview(held), enc.params, payload)
        assert bytes(held) == new
        held[:] = base
        assert _peak(lambda: codec.apply_into(memoryview(held), enc.params, payload)) < CHUNK / 16


@pytest.mark.parametrize("path", ["compiled", "c-blosc"])
@pytest.mark.parametrize("eid", [BG_ZSTD, XOR_DELTA])
def test_a_chunk_s_planes_are_decoded_by_one_native_call(eid, path, monkeypatch):
    """The planes of a keyframe (and of an XOR delta) are interleaved by one native call (its zstd
    planes decompressed into the thread's buffer first, no new object): the package's compiled
    loops, or c-blosc where they were not built; never by numpy passes.  The Python calls per
    chunk are few and the same for a 256 KiB chunk as for an 8 MiB one."""
    if path == "compiled" and not native_planes.compiled():
        pytest.skip("the compiled loops were not built (test_compiled_planes.py says why that fails here)")
    if path == "c-blosc":
        if not native_planes.available():
            pytest.skip("python-blosc is not installed")
        monkeypatch.setattr(native_planes, "_planes", None)
    counts = []
    for size in (256 << 10, 8 << 20):
        new, base = _chunks(size)[eid]
        codec = get(eid)
        enc = codec.encode(new, CTX, base)
        payload, out = bytes(enc.payload), bytearray(size)
        codec.decode_into(memoryview(out), enc.params, payload, base)
        py, c = _calls(lambda: codec.decode_into(memoryview(out), enc.params, payload, base))
        if path == "compiled":
            assert c.get("interleave") == 1 and "decompress_ptr" not in c and "decompress" not in c, c
        else:
            assert c.get("decompress_ptr") == 1 and "decompress" not in c, c
        counts.append(py)
    assert counts[0] == counts[1] <= 32, counts
