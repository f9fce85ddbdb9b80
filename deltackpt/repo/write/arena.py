"""Where a save's private copies of its chunks go when the delta cache will keep them."""

from __future__ import annotations

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
            self.buf = np.empty(max(n, min(ARENA_SEGMENT, self.left)), dtype=np.uint8)
            self.pos = 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        self.left -= n
        return out
