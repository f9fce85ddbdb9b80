"""Interleaving byte planes in native code: c-blosc's SIMD unshuffle, fed our own planes.

numpy needs seven passes over a chunk to interleave four byte planes (widen, shift, or); c-blosc's
unshuffle does it in one, near memcpy speed (bench/DELTAS.md, "Speed").  python-blosc offers it only
inside its decoder, so the planes are framed as a c-blosc 1.x chunk (c-blosc's
README_CHUNK_FORMAT.rst, format version 2) whose every stream is stored raw: block ``b`` holds, for
each plane ``k``, the segment ``plane_k[b*seg : (b+1)*seg]`` behind a 4-byte size, and c-blosc copies
each block's streams into its cache-sized block buffer and unshuffles them straight into the
destination, in C with the GIL released.  The planes are the spec's (zstd planes decompressed first,
by :func:`bytegroup.zstd_decompress_into`, with the spec's checks); c-blosc decompresses nothing.

The on-disk bytes do not change: the chunk lives in a per-thread buffer for one call, and its blocks
keep c-blosc's working memory at two blocks per call (a whole-chunk block cost 2 chunks per thread).
The numpy path stays for two planes (as fast there) and for what c-blosc cannot take: blosc not
installed, more than 16 planes, planes shorter than c-blosc splits (128 bytes), a destination numpy
cannot write to, and any error c-blosc reports.  The reader hash-checks every decoded chunk either way.
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
    # a call with more than one c-blosc thread starts a thread pool; the read path runs chunks on
    # its own threads, so each call must release the GIL.  Both are python-blosc's process-wide settings.
    _blosc.set_nthreads(1)
    _blosc.set_releasegil(True)

_HEADER = struct.Struct("<BBBBIII")    # version, versionlz, flags, typesize, nbytes, blocksize, cbytes
_FLAGS = 0x01                          # byte shuffle, may split, blosclz (never called: every stream is raw)
_MIN_PLANE = 128                       # c-blosc splits a block into typesize streams from here on
# two planes (bfloat16, float16) numpy interleaves in three cheap passes, as fast as framing them
# for c-blosc (bfloat16 states decoded 0.8-0.9x as fast through c-blosc, bench/DELTAS.md "Speed")
_MIN_WIDTH = 4
SEGMENT = 16 << 10                     # plane bytes per block: a block of 4 planes is 64 KiB, in L2


def available() -> bool:
    """Whether python-blosc is installed (the native path can run at all)."""
    return _blosc is not None


def interleave(planes: list[np.ndarray], out: np.ndarray) -> bool:
    """Write ``planes`` (``w`` uint8 arrays of ``n`` bytes) into ``out`` as ``n`` elements of ``w``
    bytes, in native code; False (``out`` untouched) when this case belongs to the numpy path."""
    width = len(planes)
    n = len(out) // width if width else 0
    if (_blosc is None or not _MIN_WIDTH <= width <= 16 or n < _MIN_PLANE or not out.flags.writeable
            or not out.flags.c_contiguous or len(out) > 0x7FFF0000):
        return False
    seg = min(n, SEGMENT)
    full, rest = divmod(n, seg)
    blocks = full + (rest > 0)
    body = _HEADER.size + 4 * blocks
    stride = width * (4 + seg)
    total = body + full * stride + (4 + width * rest if rest else 0)
    chunk = buffer("blosc", total)
    _HEADER.pack_into(chunk.data, 0, 2, 1, _FLAGS, width, len(out), width * seg, total)
    starts = chunk[_HEADER.size:body].view("<i4")
    starts[:] = body + stride * np.arange(blocks, dtype=np.int64)
    # full blocks: (block, plane, 4 + seg) with each stream's size in its first 4 bytes
    grid = chunk[body:body + full * stride].reshape(full, width, 4 + seg)
    grid[:, :, :4] = np.frombuffer(struct.pack("<i", seg), dtype=np.uint8)
    for k, plane in enumerate(planes):
        grid[:, k, 4:] = plane[:full * seg].reshape(full, seg)
    if rest:  # a shorter last block is never split: one stream, its planes' tails back to back
        pos = body + full * stride
        struct.pack_into("<i", chunk.data, pos, width * rest)
        tail = chunk[pos + 4:total].reshape(width, rest)
        for k, plane in enumerate(planes):
            tail[k] = plane[full * seg:]
    try:
        return _blosc.decompress_ptr(chunk, out.ctypes.data) == len(out)
    except Exception:  # noqa: BLE001 - any refusal: the numpy path decodes instead
        return False
