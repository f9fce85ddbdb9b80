"""A local file's bytes read where the page cache holds them, without copying them out.

A restore used to copy every pack byte out of the page cache into a buffer of its own before
decoding it (``preadv``: a fifth of a warm MiniLM load's CPU, all of it on the reading thread). A
:class:`FileMapping` maps the file read-only and hands out views, so the decoders read the bytes
where they lie.  A range whose pages are not all in memory (``mincore``) is read in by the kernel
first, in one call (``MADV_POPULATE_READ``, Linux 5.14+): a cold span costs no buffer and no copy
either, and a disk's read error there comes back as an error number, not as the SIGBUS that
touching the page would raise.  A range that cannot be read in that way gets None, and the caller
reads it into its own buffer with ``preadv``, which reports the error typed.

What is left to that signal: a page the kernel evicts between the view and the decode and then
fails to read back, or a file truncated by another program while it is mapped (packs are written
once and never truncated by deltackpt; a view never reaches past the size the file had when
mapped, and a range past its new end is refused, not read).  ``torch.load(mmap=True)``,
safetensors and numpy's memmap live with the same two.

Example::

    m = FileMapping.open(fd, size)       # None where the platform cannot map or check residency
    view = m.view(start, length)         # None where the pages cannot be had without a read of ours
    ...
    m.release(start, length)             # done with it: out of the resident set, still cached
    m.close()
"""

from __future__ import annotations

import mmap
import threading

import numpy as np

from .. import faults, libc
from .local_writer import os_error

_PAGE = mmap.PAGESIZE


def _reads_in() -> bool:
    """Whether the kernel can read pages in without their being touched (MADV_POPULATE_READ,
    Linux 5.14+); where not, cold ranges are read with preadv."""
    return libc.knows(libc.MADV_POPULATE_READ)


class FileMapping:
    """A read-only mapping of one file for the length of one read; :meth:`close` unmaps it (or,
    while a view is still held, leaves that to the last view's release)."""

    def __init__(self, mapped: mmap.mmap, size: int) -> None:
        self._map, self.size = mapped, size
        self._lock = threading.Lock()
        self._closed = False
        probe = np.frombuffer(mapped, dtype=np.uint8, count=1)
        self._address = int(probe.ctypes.data)   # the mapping's start: page-aligned
        del probe   # a held export would keep close() from unmapping

    @classmethod
    def open(cls, fd: int, size: int) -> "FileMapping | None":
        """A mapping of the first ``size`` bytes of ``fd`` (the file's size as fstat saw it), or
        None where nothing can be mapped or checked."""
        if libc.mincore is None or size <= 0:
            return None
        try:
            mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        return cls(mapped, size)

    def view(self, start: int, length: int, *, read_in: bool = True) -> memoryview | None:
        """The file's bytes ``[start, start + length)`` (fewer at its end), read-only, once every
        page of them is in memory: with ``read_in``, the pages are read in first, those the page
        cache lacks from the disk (this call then waits for it, as a read would, and the pages
        count in the process's resident set until released).  None where they are not: the read
        failed, the file is shorter now, or the kernel cannot read pages in without touching
        them.  (A caller that asked without ``read_in`` first has had the residency check: read
        in, it is not made twice.)"""
        end = min(start + length, self.size)
        if start < 0 or end <= start:
            return None
        first, last = start // _PAGE * _PAGE, -(-end // _PAGE) * _PAGE
        if not (read_in and self._read_in(first, last)) and not self._resident(first, last):
            return None
        return memoryview(self._map)[start:end]

    def _resident(self, first: int, last: int) -> bool:
        vec = np.empty((last - first) // _PAGE, dtype=np.uint8)
        if libc.mincore(self._address + first, last - first, vec.ctypes.data) != 0:
            return False
        return bool(np.bitwise_and(vec, 1).all())

    def _read_in(self, first: int, last: int) -> bool:
        """Fault the pages of ``[first, last)`` in without touching them: the kernel reads what
        the page cache lacks, and a failed read (or a page past the file's end) fails the call
        (EFAULT, EIO) instead of signalling."""
        return _reads_in() and libc.madvise(self._address + first, last - first, libc.MADV_POPULATE_READ) == 0

    def release(self, start: int, length: int) -> None:
        """Drop the pages of ``[start, start + length)`` from this process's memory: a read done
        with them would otherwise keep every page it decoded in its resident set until the
        mapping closes (the whole state's packs, beside the state itself).  They stay in the page
        cache, and a view still reading one of them (a neighbouring span sharing its first or
        last page) faults it back in, unchanged.  Each call costs the other cores a TLB flush:
        callers gather ranges (repo/read/stream.py drops 16 MiB at a time)."""
        end = min(start + length, self.size)
        first, last = max(start, 0) // _PAGE * _PAGE, -(-end // _PAGE) * _PAGE
        with self._lock:   # close() cannot unmap in between
            if self._closed or libc.madvise is None or last <= first:
                return   # (a closed mapping's addresses may hold another mapping by now)
            libc.madvise(self._address + first, last - first, libc.MADV_DONTNEED)

    def for_key(self, key: str) -> "KeyMapping":
        """This mapping as the store's ``key``: its views are read sites for the fault tests and
        their injected errors typed as a read's."""
        return KeyMapping(self, key)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        try:
            self._map.close()
        except BufferError:   # a view still held (by a traceback): unmapped when it is released
            pass


class KeyMapping:
    """A store key's mapping: every view it lends is a read site for the fault tests, as
    ``read_into`` is, and an error there is the read's typed error."""

    def __init__(self, mapping: FileMapping, key: str) -> None:
        self._mapping, self._key = mapping, key

    def view(self, start: int, length: int, *, read_in: bool = True) -> memoryview | None:
        got = self._mapping.view(start, length, read_in=read_in)
        if got is not None:
            try:
                faults.hit(f"read.{self._key.split('/', 1)[0]}")
            except OSError as exc:
                got.release()
                raise os_error(exc, "read", self._key) from None
        return got

    def release(self, start: int, length: int) -> None:
        self._mapping.release(start, length)

    def close(self) -> None:
        self._mapping.close()
