"""Memory a step takes and keeps, read from the kernel: resident set size (with the allocator's free
pages handed back first, so that memory freed but cached by malloc does not count as kept), the
peak of anonymous memory over a call (sampled in a thread), and a process's high-water mark."""

from __future__ import annotations

import ctypes
import threading
import time

import psutil

try:
    _libc = ctypes.CDLL("libc.so.6")
    _malloc_trim = _libc.malloc_trim
except (OSError, AttributeError):   # not glibc: nothing to hand back
    _libc = _malloc_trim = None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


_mallinfo2 = getattr(_libc, "mallinfo2", None)   # glibc 2.33+
if _mallinfo2 is not None:
    _mallinfo2.restype = _MallInfo2


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (0 where the kernel has no such field)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_anon() -> int:
    """Anonymous resident bytes: the process's own heap, not the page cache of files it maps."""
    return _status("RssAnon")


def vm_rss() -> int:
    """Resident bytes of this process now (its heap and the file pages it maps)."""
    return _status("VmRSS")


def vm_hwm() -> int:
    """Peak resident bytes of this process so far (of this address space: ru_maxrss would carry a
    parent's peak across execve)."""
    return _status("VmHWM")


def malloc_in_use() -> int | None:
    """Bytes malloc has handed out and not had back (live arrays, tensors, buffers: heap and mmapped
    blocks alike); None without glibc 2.33's ``mallinfo2``.  Resident memory above it is what the
    allocator keeps for reuse (free space at the top of the threads' arenas, which ``malloc_trim``
    does not hand back) or Python's own small-object arenas."""
    if _mallinfo2 is None:
        return None
    m = _mallinfo2()
    return int(m.uordblks + m.hblkhd)


def settled_rss() -> int:
    """Resident bytes once malloc's free pages are handed back: what the process holds, not what
    its allocator happens to cache.  (Tensors go when their last reference does; a full
    ``gc.collect()`` would find no more and costs most of a second with transformers loaded.)"""
    if _malloc_trim is not None:
        _malloc_trim(0)
    return psutil.Process().memory_info().rss


class PeakAnon:
    """Samples anonymous resident memory every 10 ms while the block runs; ``extra`` is the peak
    above the value at the start.

    Example::

        with PeakAnon() as mem:
            state = torch.load(path)
        print(mem.extra / 2**20, "MiB at peak")
    """

    def __init__(self) -> None:
        self.base = rss_anon()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.01)

    def __enter__(self) -> "PeakAnon":
        self.base = self.peak = rss_anon()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())

    @property
    def extra(self) -> int:
        return self.peak - self.base
