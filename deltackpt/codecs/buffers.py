"""Work buffers owned by the calling thread and reused from chunk to chunk.

A fresh multi-MiB numpy buffer costs a page fault per 4 KiB on its first write and a trip through
the allocator; a save or a load runs the same codec over thousands of chunks, each on one pool
thread, so each thread keeps one buffer per role and hands out views of it.  A view is valid until
the same thread asks for the same role again, so a role is never held across a call that may ask
for it (each role below names its one user).  Buffers larger than ``_KEEP`` (a chunk far above the
default size) are not kept, so a thread does not pin a 64 MiB buffer for the rest of the process.

Example::

    planes = buffer("planes", 3 * 524288)   # uint8 view, reused by the next call on this thread
"""

from __future__ import annotations

import threading

import numpy as np

_KEEP = 16 << 20
_MIN = 1 << 21
_local = threading.local()

# roles: "delta" holds a decoded delta before it is applied (xor/sub/scaled apply_into), or the XOR
# of a chunk and its base before its planes are grouped (xor-delta encode); "planes" holds the
# zstd planes of one payload, decompressed before they are interleaved (bytegroup.decode_planes);
# "rows" holds the changed rows of a sparse delta (sparse decode); "block*" are cache-sized
# element blocks of the integer deltas (sub_delta, scaled_delta); "blosc" holds a payload framed as
# a c-blosc chunk for the native decode (native_planes); "span" holds the pack bytes of one read
# request while its chunks are decoded (repo/read/reader.py)
ROLES = ("delta", "planes", "rows", "block", "block2", "wide", "blosc", "span")


def buffer(role: str, nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` for ``role``, owned by this thread (contents undefined)."""
    cache = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
    buf = cache.get(role)
    if buf is None or len(buf) < nbytes:
        if nbytes > _KEEP:
            return np.empty(nbytes, dtype=np.uint8)
        buf = cache[role] = np.empty(max(nbytes, _MIN), dtype=np.uint8)
    return buf[:nbytes]


def typed(role: str, dtype: np.dtype | type | str, count: int) -> np.ndarray:
    """``count`` elements of ``dtype`` from ``role``'s buffer (see :func:`buffer`)."""
    dt = np.dtype(dtype)
    return buffer(role, count * dt.itemsize).view(dt)


def release() -> None:
    """Drop this thread's buffers (see :mod:`.scratch`)."""
    _local.__dict__.pop("buffers", None)
