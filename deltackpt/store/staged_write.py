"""Writing a streamed file out of two stage buffers, past the page cache once the file is large.

:class:`StagedFile` gathers what a writer is given into a stage of :data:`STAGE_BYTES`; a full
stage is written out by a thread while the caller fills the other one, so encoding overlaps the
disk.  The first full stage tells the file is large: from then on stages are written with
``O_DIRECT`` (no page cache), and at the end the 4 KiB-aligned head of the last stage too, its tail
through the cache.  A file that never fills a stage (a small pack) is not copied at all: the views
it was given are held and written through the page cache with one ``pwritev`` at the end.

Why hold instead of copy: a 4 MB model's save wrote its packs through a fresh 4 MiB stage, a copy of
every byte into pages the kernel had to fault in and zero first (about 900 of a save's 1,800 page
faults); the views are the encoders' own output, which nothing changes once it is handed over.

Why: a GPT-2 + AdamW save (1.2 GB of packs) written through the page cache cost a 2-core VM
2.7-3.9 s of system CPU (the kernel finding, charging and filling a cache page for every 4 KiB),
and 0.3-0.9 s written directly; a later save's wall time went from 4.2-4.3 s to 1.9-2.2 s
(bench/MAINTENANCE.md, "Past the page cache").  The cost: what a save wrote directly is not in the
page cache, so a read of it soon after (a restart on the same machine, a rollback, an evaluation
job reading the newest version) reads the disk: GPT-2's newest version loaded right after its
save took 1.09 s instead of 0.93 s.  ``DELTACKPT_DIRECT_IO=0`` keeps every write in the cache.
File systems that refuse ``O_DIRECT`` (tmpfs, some network and FUSE ones) get the cache.

Why a :class:`StagePool`: a fresh stage is 1,024 pages the kernel faults in and zeroes at its
first fill, and a GPT-2 + AdamW save writes ~19 packs one after another: 38 fresh stages, ~40,000
of its ~57,000 page faults.  Files written in turn take their stages from a pool their owner (a
save's packer) holds and closes, and map 2-4 in all.

Example::

    staged = StagedFile(path, fd)     # fd: the file opened for writing, through the cache
    staged.write(memoryview(data))    # any number of times
    staged.finish()                   # every byte handed to the kernel; then fsync(fd)
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ..threads import leave_signals_to_main

STAGE_BYTES = 4 << 20
"""Bytes per stage (two per open file).  4 MiB: a direct write this long runs at the disk's
speed here, and a save writing two packs at once holds 16 MiB of stages."""

HELD_VIEWS = 512
"""Views a file under one stage holds before it copies them into a stage instead (a pack of many
tiny objects): one ``pwritev`` takes them all (Linux allows 1,024)."""

_ALIGN = 4096   # what O_DIRECT asks of offsets, lengths and addresses on common disks (at most)
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def direct_wanted() -> bool:
    """Whether large files are written past the page cache (``DELTACKPT_DIRECT_IO``, on by default
    where the system has ``O_DIRECT``)."""
    return bool(_O_DIRECT) and os.environ.get("DELTACKPT_DIRECT_IO", "1") != "0"


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view, offset = view[n:], offset + n


def _pwritev_all(fd: int, views: list[memoryview], offset: int) -> None:
    """``views`` (none empty) one after the other from ``offset``, in as few calls as the system takes."""
    if not hasattr(os, "pwritev"):
        _pwrite_all(fd, memoryview(b"".join(views)), offset)
        return
    while views:
        n = os.pwritev(fd, views, offset)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        offset += n
        done = 0
        while done < len(views) and n >= len(views[done]):
            n -= len(views[done])
            done += 1
        views = views[done:]
        if n:   # a short write ended inside a view
            views = [views[0][n:], *views[1:]]


def _fresh_stage() -> mmap.mmap:
    return mmap.mmap(-1, STAGE_BYTES, flags=mmap.MAP_PRIVATE)


def _unmap(stage: mmap.mmap) -> None:
    try:
        stage.close()
    except BufferError:   # a view still held (by the traceback of a failed write): freed with it
        pass


class StagePool:
    """Stages handed from one file to the next of a run of files written in turn (a save's packs),
    instead of each file mapping and unmapping its own; :meth:`close` unmaps them.  A file holds
    at most two at a time, so the pool never holds more than the files written side by side used.
    Stages come back with stale bytes: a file writes only what it filled.

    Example::

        pool = StagePool()
        for path, fd in files:                    # one after another
            staged = StagedFile(path, fd, stages=pool)
            ...
            staged.finish()                       # its stages back in the pool
        pool.close()
    """

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()   # a writer aborted on another thread gives its stages back
        self._closed = False
        self.mapped = 0   # stages this pool mapped (a test and the bench count them)

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.mapped += 1
        return _fresh_stage()

    def give(self, stage: mmap.mmap) -> None:
        with self._lock:
            if not self._closed:
                self._free.append(stage)
                return
        _unmap(stage)   # a file that outlived the pool's owner

    def close(self) -> None:
        with self._lock:
            free, self._free, self._closed = self._free, [], True
        for stage in free:
            _unmap(stage)


class StagedFile:
    """The stages, the ``O_DIRECT`` descriptor and the thread writing full stages, of one file
    being written; :meth:`finish` or :meth:`close` joins the thread and frees the rest.  One
    thread per file, started at the first full stage: a thread per stage cost a 87 MB first save
    21 thread starts, each waiting for the new thread to take the GIL from the encoders."""

    def __init__(self, path: str, fd: int, stages: StagePool | None = None) -> None:
        self._path, self._fd = path, fd
        self._pool = stages   # where its stages come from and go back to; None: its own
        self._held: list[memoryview] = []   # what was given, while it fits in a stage
        self._held_bytes = 0
        self._stages: list[mmap.mmap] = []  # from the first write that would not fit
        self._fill = 0        # bytes in the current stage (self._stages[0])
        self.flushed = 0      # bytes of the file handed to the writing thread or written
        self._direct = direct_wanted()
        self._dfd: int | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._job: Future | None = None

    @property
    def direct(self) -> bool:
        """Whether stages go past the page cache now (the file has filled one, and the file
        system took ``O_DIRECT``)."""
        return self._dfd is not None

    def write(self, view: memoryview) -> None:
        """Take ``view``.  It may be held, not copied, until :meth:`finish`: the caller must not
        change its bytes after handing it over."""
        if not self._stages:
            if self._held_bytes + len(view) < STAGE_BYTES and len(self._held) < HELD_VIEWS:
                if view:
                    self._held.append(view)
                    self._held_bytes += len(view)
                return
            self._stages.append(self._new_stage())
            held, self._held, self._held_bytes = self._held, [], 0
            for part in held:
                self._copy(part)
        self._copy(view)

    def _new_stage(self) -> mmap.mmap:
        return self._pool.take() if self._pool is not None else _fresh_stage()

    def _copy(self, view: memoryview) -> None:
        while view:
            k = min(len(view), STAGE_BYTES - self._fill)
            self._stages[0][self._fill:self._fill + k] = view[:k]
            self._fill += k
            view = view[k:]
            if self._fill == STAGE_BYTES:
                self._hand_off()

    def _hand_off(self) -> None:
        """Write the full stage on the file's writing thread and go on in the other one."""
        self._wait()
        if self._direct and self._dfd is None:
            try:
                self._dfd = os.open(self._path, os.O_WRONLY | _O_DIRECT | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self._direct = False
        full, at = self._stages.pop(0), self.flushed
        if not self._stages:
            self._stages.append(self._new_stage())
        self._stages.append(full)
        self._fill = 0
        self.flushed += STAGE_BYTES
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, "deltackpt-stage-write", initializer=leave_signals_to_main)
        try:
            self._job = self._writer.submit(self._put, memoryview(full), at)
        except RuntimeError:   # no new thread once the interpreter shuts down: write it here
            self._put(memoryview(full), at)

    def _put(self, view: memoryview, at: int) -> None:
        """``view`` at ``at``: its 4 KiB-aligned head directly where direct writes are on, the rest
        through the cache (and all of it, from then on, where the disk refuses the alignment)."""
        if self._dfd is not None:
            head = len(view) // _ALIGN * _ALIGN
            try:
                _pwrite_all(self._dfd, view[:head], at)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # an alignment this disk refuses: the cache from here on (no other thread uses
                # the descriptor: the next hand-off joins this one first)
                self._direct = False
                self._close_direct()
                head = 0
            view, at = view[head:], at + head
        _pwrite_all(self._fd, view, at)

    def _wait(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.result()   # the write's error, raised here

    def finish(self) -> None:
        """Write what the stages hold: every byte given is in the kernel's hands when it returns
        (the caller's fsync makes it durable)."""
        self._wait()
        if self._held:   # the file never filled a stage: nothing of it is written yet
            _pwritev_all(self._fd, self._held, 0)
            self.flushed = self._held_bytes
            self._held, self._held_bytes = [], 0
        if self._fill:
            self._put(memoryview(self._stages[0])[:self._fill], self.flushed)
            self.flushed += self._fill
            self._fill = 0
        self.close()

    def close(self) -> None:
        """Join the writing thread (its error dropped: the file is being abandoned or was
        finished) and free the stages and the direct descriptor."""
        if self._job is not None:
            self._job.exception()
            self._job = None
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        self._close_direct()
        self._held, self._held_bytes = [], 0
        stages, self._stages = self._stages, []
        for stage in stages:   # the writing thread is joined: nothing writes from them any more
            if self._pool is not None:
                self._pool.give(stage)
            else:
                _unmap(stage)

    def _close_direct(self) -> None:
        if self._dfd is not None:
            close_quiet(self._dfd)
            self._dfd = None


def close_quiet(fd: int) -> None:
    """Close ``fd`` on a path that is already failing or abandoning the file: an error here
    would only hide the first one."""
    try:
        os.close(fd)
    except OSError:
        pass
