"""Byte grouping ("shuffle"): byte k of every element goes into plane k.

Float exponents sit in the high bytes, so their plane is highly compressible while low mantissa
planes are noise.  Each plane is zstd-compressed only when a sample says it pays, so
incompressible planes cost a copy, not a compression (the ZipNN observation).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import zstandard

from ..errors import CorruptObjectError

_SAMPLE = 16 * 1024
_PAYS = 0.97  # a plane whose sample compresses worse than this is stored raw
_local = threading.local()

# zstd's level 1 hunts for 6-byte matches in a 2^13-entry table.  The byte planes of a float
# keyframe are mostly entropy-coded literals (an exponent plane of trained weights: ~3 bits a byte;
# short matches are chance and cost more than they save), so keyframe planes longer than twice
# the sample are compressed, at the default level, with 7-byte matches from a 64-entry table:
# 2.7x faster than level 1 and a little smaller (minilm-frozen: 25.3 MiB of exponent planes,
# 102 -> 38 ms, 9.14 -> 8.77 MiB).  Planes with real repeats (some Adam moments) do better at the
# level (+7 % bytes tuned), so the sample picks whichever is smaller; delta planes keep the level.
# Decoding is plain zstd either way.
_FAST_PLANES = True
_PLANE_PARAMS = dict(strategy=zstandard.STRATEGY_FAST, window_log=19, chain_log=12, hash_log=6, search_log=1,
                     min_match=7, target_length=0)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def _plane_compressor(level: int, literals: bool) -> zstandard.ZstdCompressor:
    """The compressor for planes longer than twice the sample (see _PLANE_PARAMS)."""
    if level != 1 or not literals or not _FAST_PLANES:
        return _compressor(level)
    c = getattr(_local, "planes", None)
    if c is None:
        params = zstandard.ZstdCompressionParameters(**_PLANE_PARAMS, write_content_size=True)
        c = _local.planes = zstandard.ZstdCompressor(compression_params=params)
    return c


def _choose(sample: memoryview, level: int, literals: bool) -> tuple[zstandard.ZstdCompressor, int]:
    """The compressor for a long plane and its size on ``sample``: with ``literals``, whichever of
    the literal-tuned parameters and the level does better on the sample (the level wins on some
    optimizer moments, whose planes repeat more)."""
    cctx = _compressor(level)
    size = len(cctx.compress(sample))
    tuned = _plane_compressor(level, literals)
    if tuned is not cctx:
        tuned_size = len(tuned.compress(sample))
        if tuned_size <= size:
            return tuned, tuned_size
    return cctx, size


def group(data: bytes | memoryview | np.ndarray, width: int) -> np.ndarray:
    """Planes of ``data`` as a (width, n) uint8 array; ``len(data)`` must be a multiple of width."""
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)
    if width == 1:
        return arr.reshape(1, -1)
    rows = arr.reshape(-1, width)
    out = np.empty((width, rows.shape[0]), dtype=np.uint8)
    for k in range(width):  # one strided copy per plane: ~3x faster than a transposed copy
        out[k] = rows[:, k]
    return out


def ungroup(planes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`group`: flat uint8 array (written into ``out`` when given)."""
    if out is None:
        out = np.empty(planes.size, dtype=np.uint8)
    if planes.shape[0] == 1:
        out[:] = planes.reshape(-1)
        return out
    rows = out.reshape(planes.shape[1], planes.shape[0])
    for k in range(planes.shape[0]):
        rows[:, k] = planes[k]
    return out


def zstd_compress(data: bytes | memoryview, level: int) -> bytes:
    return _compressor(level).compress(data)


def zstd_decompress(data: bytes | memoryview, expected: int, *, what: str) -> bytes:
    """Decompress one frame whose content size must be exactly ``expected`` (checked before allocating)."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise CorruptObjectError(f"{what}: not a zstd frame") from None
    if size != expected:
        raise CorruptObjectError(f"{what}: zstd frame declares {size} bytes, expected {expected}")
    try:
        out = _decompressor().decompress(data, max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise CorruptObjectError(f"{what}: zstd error: {exc}") from None
    if len(out) != expected:
        raise CorruptObjectError(f"{what}: zstd produced {len(out)} bytes, expected {expected}")
    return out


def encode_planes(data: bytes | memoryview | np.ndarray, width: int, level: int, *,
                  literals: bool = False) -> tuple[dict[str, Any], memoryview]:
    """Byte-group ``data`` and compress each plane that pays. Returns (params, payload).
    ``literals``: the planes are mostly literals (a keyframe of floats), see _PLANE_PARAMS.

    The payload is assembled in one preallocated buffer: each plane is copied once, raw or
    compressed, which matters more than it seems (fresh multi-MiB buffers cost page faults)."""
    planes = group(data, width)
    n = planes.shape[1] if planes.size else 0
    out = bytearray(width * n)
    modes: list[int] = []
    sizes: list[int] = []
    pos = 0
    for plane in planes:
        mv = memoryview(plane)
        comp = None
        if len(mv) > 2 * _SAMPLE:
            cctx, size = _choose(mv[:_SAMPLE], level, literals)
            if size <= _PAYS * _SAMPLE:
                comp = cctx.compress(mv)
        elif len(mv):
            comp = zstd_compress(mv, level)
        if comp is not None and len(comp) < len(mv):
            part, mode = comp, 1
        else:
            part, mode = mv, 0
        out[pos:pos + len(part)] = part
        pos += len(part)
        modes.append(mode)
        sizes.append(len(part))
    return {"w": width, "m": modes, "s": sizes}, memoryview(out)[:pos]


def decode_planes(params: dict[str, Any], payload: bytes | memoryview, raw_len: int, *, what: str,
                  out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`encode_planes`; returns a flat uint8 array of ``raw_len`` bytes (``out``
    when given)."""
    width, modes, sizes = params.get("w"), params.get("m"), params.get("s")
    if (not isinstance(width, int) or not 1 <= width <= 16 or not isinstance(modes, list) or not isinstance(sizes, list)
            or len(modes) != width or len(sizes) != width or raw_len % width):
        raise CorruptObjectError(f"{what}: byte-group parameters are malformed")
    n = raw_len // width
    if out is None:
        out = np.empty(raw_len, dtype=np.uint8)
    elif len(out) != raw_len:
        raise CorruptObjectError(f"{what}: destination holds {len(out)} bytes, expected {raw_len}")
    rows = out.reshape(n, width)  # each plane is written straight to its strided column
    view = memoryview(payload)
    pos = 0
    for k, (mode, size) in enumerate(zip(modes, sizes)):
        if not isinstance(size, int) or size < 0 or pos + size > len(view) or mode not in (0, 1):
            raise CorruptObjectError(f"{what}: plane {k} runs past the payload")
        part = view[pos:pos + size]
        pos += size
        if mode == 0:
            if size != n:
                raise CorruptObjectError(f"{what}: raw plane {k} has {size} bytes, expected {n}")
            rows[:, k] = np.frombuffer(part, dtype=np.uint8)
        else:
            rows[:, k] = np.frombuffer(zstd_decompress(part, n, what=f"{what} plane {k}"), dtype=np.uint8)
    if pos != len(view):
        raise CorruptObjectError(f"{what}: {len(view) - pos} trailing payload bytes")
    return out


def width_for(itemsize: int, raw_len: int) -> int:
    """Plane count: the element size when it divides the chunk (it always does for row-aligned chunks)."""
    w = min(itemsize, 8) if itemsize in (1, 2, 4, 8, 16) else 1
    while w > 1 and raw_len % w:
        w //= 2
    return w
