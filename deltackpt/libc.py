"""libc calls Python's ``os`` module lacks, on an address: ``madvise`` and ``mincore``.

Found in the process's own symbols (``ctypes.util.find_library("c")`` would run ``ldconfig`` in a
subprocess: 3.5 ms of a restart's first load).  Each is None where the system has no such call or
is not Linux (their flags and vectors are Linux's); callers then do without.

Example::

    if libc.madvise is not None:
        libc.madvise(address, length, libc.MADV_DONTNEED)
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from typing import Any

MADV_DONTNEED = 4
MADV_POPULATE_READ = 22    # Linux 5.14+
MADV_POPULATE_WRITE = 23   # Linux 5.14+


def _function(name: str) -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p if name == "mincore" else ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


madvise = _function("madvise")
"""``madvise(address, length, advice) -> 0 or -1`` (errno set), or None."""
mincore = _function("mincore")
"""``mincore(address, length, vector) -> 0 or -1``: bit 0 of ``vector[i]`` set when page ``i``
is in memory; or None."""


@functools.lru_cache(maxsize=None)
def knows(advice: int) -> bool:
    """Whether this kernel accepts ``madvise`` ``advice`` (MADV_POPULATE_*: Linux 5.14+), asked once
    of a page of its own."""
    if madvise is None:
        return False
    page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf = (ctypes.c_char * mmap.PAGESIZE).from_buffer(page)
        ok = madvise(ctypes.addressof(buf), mmap.PAGESIZE, advice) == 0
        del buf
        return ok
    finally:
        page.close()
