"""Where a save's private copies of its chunks go when the delta cache will keep them."""

from __future__ import annotations

import mmap

import numpy as np

ARENA_SEGMENT = 32 << 20  # copies kept by the delta cache are carved from buffers this large


class CopyArena:
    """Where a save's private copies of its chunks go when the delta cache will keep them: slices
    of a few large numpy buffers instead of one fresh ``bytes`` per chunk.  Kept memory is fresh
    memory, and a fresh 2 MiB allocation costs 512 page faults; numpy backs buffers of 4 MiB and
    more with transparent huge pages, which makes the copy of a 100 MiB state ~3x cheaper.

    A buffer lives while any slice of it does, so only copies the cache will hold come from here
    (at most its size, in save order, which is the order the cache fills and is refilled by the
    next save); transient copies (cache off or full, lossy blobs) stay per-chunk ``bytes`` so the
    save's memory stays bounded by the cache plus the window.  At most about one segment more than
    the cache is held while a save replaces the previous save's copies."""

    def __init__(self, budget: int) -> None:
        self.left = budget     # bytes the cache can still take
        self.buf: np.ndarray | None = None
        self.pos = 0

    def take(self, n: int) -> np.ndarray | None:
        if n > self.left or n == 0:
            return None
        if self.buf is None or self.pos + n > len(self.buf):
            self.buf = _segment(max(n, min(ARENA_SEGMENT, self.left)))
            self.pos = 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        self.left -= n
        return out


def _segment(size: int) -> np.ndarray:
    """A buffer of its own pages (an anonymous mapping, huge pages asked for): unmapped when its
    last slice goes, so the memory the cache gave up goes back to the system at once instead of
    staying in malloc's heap (glibc raises its mmap threshold after a large free, and the next
    segments then come from the heap, whose freed pages a trim does not always return)."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):   # not a POSIX system: malloc's
        return np.empty(size, dtype=np.uint8)
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # not shared with a fork
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass   # no transparent huge pages here: small pages
    return np.frombuffer(mm, dtype=np.uint8)
