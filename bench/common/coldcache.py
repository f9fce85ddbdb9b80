"""Cold page cache for timed loads, without root: fsync every file of a system's output, then
``posix_fadvise(DONTNEED)`` each one, so the next read goes to the disk.

Two independent checks that it worked, both recorded in the results: ``resident_bytes`` asks the
kernel which pages of the files are still cached (``mincore`` on a fresh mapping, through ctypes),
and ``io_read_bytes`` is this process's ``read_bytes`` from /proc/self/io (bytes that reached the
block layer: 0 for a read served by the page cache).  On a tmpfs the drop does nothing; the
resident count then says so.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from typing import Any, Callable, Iterable

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def files_under(*paths: str) -> list[str]:
    """Every regular file under the given folders (or the paths themselves when they are files)."""
    out = []
    for p in paths:
        if os.path.isfile(p):
            out.append(p)
            continue
        for root, _, names in os.walk(p):
            out += [os.path.join(root, n) for n in names if os.path.isfile(os.path.join(root, n))]
    return out


def sync(files: Iterable[str], evict: bool = False) -> None:
    """fsync each file (a save that did not, torch.save's, would otherwise be written back by the
    kernel during the next timed read); with ``evict``, then drop its pages from the page cache."""
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
            if evict:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(files: Iterable[str]) -> None:
    """Read each file once, so that the next read finds it in the page cache."""
    for path in files:
        try:
            with open(path, "rb") as f:
                while f.read(64 << 20):
                    pass
        except FileNotFoundError:
            continue


def drop(files: Iterable[str]) -> None:
    """Write each file's dirty pages out (DONTNEED skips dirty pages), then evict its clean ones."""
    sync(files, evict=True)


def resident_bytes(files: Iterable[str]) -> int:
    """Bytes of the files that are in the page cache now (mincore over a read-only shared mapping)."""
    page = mmap.PAGESIZE
    total = 0
    for path in files:
        try:   # a temp file the library renamed or removed since the listing holds nothing
            size = os.path.getsize(path)
            fd = os.open(path, os.O_RDONLY) if size else -1
        except FileNotFoundError:
            continue
        if size == 0:
            continue
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, _MAP_FAILED):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            try:
                vec = ctypes.create_string_buffer((size + page - 1) // page)
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
                total += sum(b & 1 for b in vec.raw) * page
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total


def io_read_bytes() -> int:
    """This process's bytes read from storage so far (all its threads); -1 where /proc lacks it."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def cold(fn: Callable[..., Any], files: list[str], *a: Any) -> tuple[float, Any, dict]:
    """Drop ``files`` from the page cache, then time ``fn(*a)``.  Returns (seconds, result,
    {"io_read": bytes that reached storage during the call, "resident_after_drop": bytes still cached
    just before it (0 when the drop worked)})."""
    drop(files)
    left = resident_bytes(files)
    r0 = io_read_bytes()
    t0 = time.perf_counter()
    out = fn(*a)
    dt = time.perf_counter() - t0
    r1 = io_read_bytes()
    return dt, out, {"io_read": r1 - r0 if r0 >= 0 and r1 >= 0 else -1, "resident_after_drop": left}


def probe(folder: str, mib: int = 64) -> dict:
    """Check on this machine that a drop works: write and fsync a file, read it cold twice and warm
    once; a working drop leaves 0 bytes resident and reads the whole file from disk each cold time."""
    path = os.path.join(folder, "coldcache-probe")
    with open(path, "wb") as f:
        f.write(os.urandom(mib << 20))
        f.flush()
        os.fsync(f.fileno())
    out: dict = {"MiB": mib, "cold": []}
    try:
        for _ in range(2):
            dt, _, io = cold(lambda: open(path, "rb").read(), [path])
            out["cold"].append({"s": dt, **io})
        r0, t0 = io_read_bytes(), time.perf_counter()
        with open(path, "rb") as f:
            f.read()
        out["warm"] = {"s": time.perf_counter() - t0, "io_read": io_read_bytes() - r0}
    finally:
        os.unlink(path)
    out["works"] = all(c["resident_after_drop"] == 0 and c["io_read"] >= mib << 20 for c in out["cold"])
    return out
