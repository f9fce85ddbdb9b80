"""Decoding the plane layout in native code: c-blosc's zstd and SIMD unshuffle, fed our own planes.

The plane layout (spec/codecs/bg-zstd.md) of one chunk is what c-blosc 1.x's chunk format
(c-blosc's README_CHUNK_FORMAT.rst, format version 2) calls one byte-shuffled block split into
``w`` streams: stream k is plane k, stored raw (its size equals ``n``) or compressed by zstd (one
standard frame).  So a payload becomes a blosc chunk by writing a 16-byte header, one block start
and a 4-byte size before each plane, and python-blosc's ``decompress_ptr`` then decompresses each
zstd plane and unshuffles all of them straight into the destination, in C with the GIL released.
numpy needs seven passes over the chunk to interleave four planes (widen, shift, or); c-blosc's
unshuffle is one, near memcpy speed (bench/DELTAS.md, "Speed").

The on-disk bytes do not change: the blosc chunk lives in a per-thread buffer for one call.  This
is only a faster way to the bytes the spec defines, so every case where the two could disagree
stays on the numpy path: blosc not installed, a width outside 2..16, planes shorter than c-blosc
splits (128 bytes), a zstd plane exactly ``n`` bytes long (c-blosc would take it for a raw one), a
destination numpy cannot write to, and any error c-blosc reports (a plane holding bytes after its
frame, which the spec ignores and zstd does not).  Every frame's declared size is checked before
this runs, as on the numpy path, and the decoded chunk is hash-checked by the reader either way.
"""

from __future__ import annotations

import struct

import numpy as np

from .buffers import buffer

try:
    import blosc as _blosc
except ImportError:  # optional at run time: the numpy path decodes the same bytes
    _blosc = None
else:
    # one block per chunk leaves c-blosc's own threads nothing to share, and a call with more than
    # one starts a thread pool; the read path runs chunks on its own threads, so each call must
    # release the GIL.  Both settings are python-blosc's process-wide ones.
    _blosc.set_nthreads(1)
    _blosc.set_releasegil(True)

_HEADER = struct.Struct("<BBBBIIIi")   # version, versionlz, flags, typesize, nbytes, blocksize, cbytes, bstart
_FLAGS = 0x01 | (4 << 5)               # byte shuffle, may split, zstd
_MIN_PLANE = 128                       # c-blosc splits a block into typesize streams from here on
_SIZE = struct.Struct("<i")


def available() -> bool:
    """Whether python-blosc is installed (the native path can run at all)."""
    return _blosc is not None


def decode_into(modes: list, spans: list[tuple[int, int]], payload: memoryview, width: int,
                out: np.ndarray) -> bool:
    """Interleave the planes at ``spans`` of ``payload`` into ``out`` in native code; False (and
    ``out`` undefined) when this case belongs to the numpy path.  Sizes and frame headers must have
    been checked by the caller."""
    n = len(out) // width
    if (_blosc is None or not 2 <= width <= 16 or n < _MIN_PLANE or not out.flags.writeable
            or not out.flags.c_contiguous or len(out) > 0x7FFF0000):
        return False
    total = _HEADER.size + 4 * width
    for mode, (_, size) in zip(modes, spans):
        if mode == 1 and size == n:
            return False
        total += size
    chunk = buffer("blosc", total)
    _HEADER.pack_into(chunk, 0, 2, 1, _FLAGS, width, len(out), len(out), total, _HEADER.size)
    pos = _HEADER.size
    for start, size in spans:
        _SIZE.pack_into(chunk, pos, size)
        chunk[pos + 4:pos + 4 + size] = np.frombuffer(payload[start:start + size], dtype=np.uint8)
        pos += 4 + size
    try:
        return _blosc.decompress_ptr(chunk, out.ctypes.data) == len(out)
    except Exception:  # noqa: BLE001 - any refusal: the numpy path decides, with the spec's errors
        return False
