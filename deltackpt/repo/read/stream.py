"""One read's pack bytes, streamed: the calling thread reads spans of packs in order into a few
reused buffers and hands each span to the decode pool, while a prefetch thread asks the store to
fetch the spans after it, and the objects their deltas' bases are read from (a local store: the
kernel reads them into the page cache in the background; a hint can block while the kernel queues
the reads, so it gets a thread of its own).  A span of a pack the store maps (a local file:
``Store.map_value``) is not read into a buffer at all: the mapping has the kernel bring in the
pages the page cache lacks, the pool decodes the span where it lies, and its pages leave the
process's resident set once it is decoded.

So the cores decode while the disk reads, no decode worker waits in a read or a prefetch call,
and memory stays bounded whatever the size of the state: at most ``slots`` spans read and not
decoded yet in span buffers (each as long as the longest span read, at most READ_SPAN bytes
unless one object is longer), as many read in place, RELEASE_BATCH of decoded spans' pages, plus
what the page cache holds for the prefetch window, which is the kernel's, not the process's.
The buffers and the prefetch thread are this call's: when it returns, every decode it started
has finished, the thread is joined and the buffers are released.  A read of at most
PREFETCH_MIN_BYTES starts no prefetch thread.

Example::

    stream = SpanStream(store, slots=4, window=16 << 20)
    stream.run(groups, spans, decode, pool)   # decode(group, bytes of its span or None) on the pool
"""

from __future__ import annotations

import itertools
import mmap
import queue
import threading
from concurrent.futures import Executor, Future
from typing import Any, Callable, NamedTuple, Sequence

from ... import threads as worker_threads
from ...errors import ObjectNotFoundError
from ...store.base import MappedValue, Store
from ..layout import pack_key

# A read of at most this many pack bytes gets no prefetch thread: the kernel's own read-ahead
# serves it, and starting the thread cost a 4 MB load more than the hints saved.
PREFETCH_MIN_BYTES = 8 << 20
# Mapped spans' pages are dropped from the process's memory this many decoded bytes at a time (_Decoded).
RELEASE_BATCH = 16 << 20


class Span(NamedTuple):
    """``length`` bytes of pack ``pack_id`` from ``start``, read into a buffer of ``room`` bytes:
    at its start, or in ``pieces`` ((position in the buffer, bytes) of consecutive pack bytes) so
    that the decoder finds scratch room around each object (codecs.base.Room)."""

    pack_id: str
    start: int
    length: int
    pieces: tuple[tuple[int, int], ...] = ()
    room: int = 0
    bases: tuple[tuple[str, int, int], ...] = ()   # (pack id, start, length) its deltas' bases are read from

    @property
    def fetched(self) -> int:
        """The pack bytes reading this span's objects and their bases takes."""
        return self.length + sum(n for _p, _s, n in self.bases)

    @property
    def size(self) -> int:
        """The buffer bytes this span needs."""
        return max(self.length, self.room)


class SpanStream:
    """Reads spans in order into ``slots`` reused buffers, ``window`` bytes of prefetch ahead.

    ``spans[i]`` is the pack span group ``i`` needs, or None for a group that reads on its own
    (nothing planned: a chunk served from the decoded cache, or one the index does not hold)."""

    def __init__(self, store: Store, *, slots: int, window: int) -> None:
        self.store, self.slots, self.window = store, max(1, slots), window
        self.peak_buffer_bytes = 0   # what the span buffers held at most (a test checks the bound)

    def run(self, groups: Sequence[Any], spans: "Sequence[Span | None]",
            decode: "Callable[[Any, memoryview | None], None]", pool: Executor | None, *,
            read_failed: "Callable[[Any, BaseException], None] | None" = None) -> None:
        """``decode(group, data)`` for every group, on ``pool`` (inline without one), with ``data``
        the bytes of its span (shorter at a pack's end; None when the pack is gone or the group
        has no span): the pack's own bytes, read-only, where the store maps them (its objects at
        their offset from ``span.start``), else a span buffer, writable, its objects where
        ``span.pieces`` put them.  The first failure stops the reading; the call
        returns once every decode it started has finished, raising the failure of the earliest
        group that failed (a read error is raised as it is, after ``read_failed(group, error)``
        has seen it)."""
        buffers: list[mmap.mmap] = []
        mapped: dict[str, MappedValue | None] = {}
        decoded = _Decoded(mapped)
        free: queue.SimpleQueue[int] = queue.SimpleQueue()
        # spans the mapping read in and not decoded yet: their pages are the process's until decoded,
        # and a reader faster than the decoders would otherwise hold the whole read (spans already
        # in memory are mapped as the decoder reads them, and a bound on them cost a warm GPT-2
        # load ~3% in the reader's extra wake-ups)
        read_in = threading.BoundedSemaphore(self.slots)
        failed = threading.Event()
        futures: list[Future] = []
        ahead = _Prefetcher(self.store, spans, self.window) if (
            len(spans) > 1 and self.store.prefetches
            and sum(s.fetched for s in spans if s is not None) > PREFETCH_MIN_BYTES) else None

        def decode_and_free(group: Any, data: "memoryview | None", slot: int | None,
                            span: "Span | None" = None, held: bool = False) -> None:
            try:
                if not failed.is_set():
                    decode(group, data)
            except BaseException:
                failed.set()
                raise
            finally:
                if slot is not None:
                    free.put(slot)
                elif span is not None and data is not None:   # the pack's own bytes: out of our memory
                    decoded.add(span)
                if held:
                    read_in.release()

        try:
            for i, (group, span) in enumerate(zip(groups, spans)):
                if failed.is_set():
                    break
                if ahead is not None:
                    ahead.reading(i)
                slot, data, held = None, None, False
                if span is not None:
                    try:
                        data = self._in_place(mapped, span, read_in=False)
                        if data is None:
                            if ahead is not None:
                                ahead.missing()
                            held = read_in.acquire()
                            data = self._in_place(mapped, span, read_in=True)
                        if data is None:
                            if held:
                                read_in.release()
                                held = False
                            slot = self._slot(buffers, free, span.size)
                            data = self._read(buffers[slot], span)
                    except BaseException as exc:
                        if held:
                            read_in.release()
                        if slot is not None:
                            free.put(slot)
                        if read_failed is not None:
                            read_failed(group, exc)
                        raise
                if pool is None:
                    decode_and_free(group, data, slot, span, held)
                else:
                    futures.append(pool.submit(decode_and_free, group, data, slot, span, held))
        finally:
            if ahead is not None:
                ahead.close()
            for f in futures:   # nothing this call started runs after it returns
                try:
                    f.result()
                except BaseException:  # noqa: BLE001 - raised below, in group order
                    pass
            for f in futures:
                f.result()
            for buf in buffers:
                try:
                    buf.close()
                except BufferError:  # a view still held (by a traceback): freed with it
                    pass
            for value in mapped.values():
                if value is not None:
                    value.close()

    def _in_place(self, mapped: "dict[str, MappedValue | None]", span: Span, *,
                  read_in: bool) -> "memoryview | None":
        """The span's pack bytes where they lie, when the store maps the pack and holds them in
        memory, or with ``read_in`` reads them in (no copy into a span buffer); else None."""
        if span.pack_id not in mapped:
            mapped[span.pack_id] = self.store.map_value(pack_key(span.pack_id))
        value = mapped[span.pack_id]
        return None if value is None else value.view(span.start, span.length, read_in=read_in)

    def _slot(self, buffers: list[mmap.mmap], free: "queue.SimpleQueue[int]", length: int) -> int:
        """A free buffer of at least ``length`` bytes: a new one while fewer than ``slots`` exist,
        else the next one a decode gives back (grown when too short)."""
        if len(buffers) < self.slots and free.empty():
            buffers.append(_anonymous(length))
            self.peak_buffer_bytes = max(self.peak_buffer_bytes, sum(len(b) for b in buffers))
            return len(buffers) - 1
        slot = free.get()
        if len(buffers[slot]) < length:
            old = buffers[slot]
            buffers[slot] = _anonymous(length)
            try:
                old.close()
            except BufferError:
                pass
            self.peak_buffer_bytes = max(self.peak_buffer_bytes, sum(len(b) for b in buffers))
        return slot

    def _read(self, buf: mmap.mmap, span: Span) -> "memoryview | None":
        """The span's bytes in ``buf``: the view ends where the bytes read end (a pack cut short)."""
        view = memoryview(buf)[:span.size]
        pieces = span.pieces or ((0, span.length),)
        try:
            n = self.store.read_into(pack_key(span.pack_id), span.start, [view[p:p + k] for p, k in pieces])
        except (ObjectNotFoundError, FileNotFoundError):
            return None  # each chunk of the group finds another copy (or the error) on its own
        if n == span.length:
            return view
        for p, k in pieces:   # the piece the read stopped in ends the bytes there are
            if n < k:
                return view[:p + n]
            n -= k
        return view


class _Decoded:
    """Mapped spans whose decode has finished, handed back to their mappings RELEASE_BATCH bytes at
    a time, back-to-back ones in one call: each call costs the other cores a TLB flush (a MiniLM
    load: ~10 calls instead of ~400, the wall time of keeping every page mapped, 0.1705 s median
    of 12 either way, where span by span cost ~5 ms).  What a load holds of the packs beyond its
    tensors stays under RELEASE_BATCH plus the spans being decoded."""

    def __init__(self, mapped: "dict[str, MappedValue | None]") -> None:
        self._mapped = mapped
        self._lock = threading.Lock()
        self._spans: list[tuple[str, int, int]] = []
        self._bytes = 0

    def add(self, span: Span) -> None:
        with self._lock:
            self._spans.append((span.pack_id, span.start, span.length))
            self._bytes += span.length
            if self._bytes < RELEASE_BATCH:
                return
            spans, self._spans, self._bytes = sorted(self._spans), [], 0
        for pid, start, length in _runs(spans):
            value = self._mapped.get(pid)
            if value is not None:
                value.release(start, length)


class _Prefetcher:
    """Hints the spans after the one being read, until ``window`` bytes are hinted and not read
    yet, on a thread of its own: a hint may block while the kernel queues the reads, and the
    reader must not wait for it.  :meth:`close` joins the thread.

    Its first hint starts with the span the reader reads first: hinting only what comes after it
    queued up to a window of read-ahead in front of the reader's own read, and a cold MiniLM load
    decoded nothing for its first 85 ms (23 ms with the first span hinted first).
    The thread wakes only when what is hinted ahead has fallen to half the window, and then hints
    up to the whole window, back-to-back spans of one pack as one range (the store splits it into
    the pieces the kernel reads whole: store/local.py).  Woken and hinting span by span, it cost a
    warm read, where there is nothing to fetch, a wake-up and an open, hint and close per span
    (MiniLM from the page cache: 182 hints and ~1,200 context switches a load).  And after its
    first window it hints only once the reader has met a span the store does not hold in memory
    (:meth:`missing`): a warm read gets one round of hints, where a 16 MiB window hinted half at a
    time gave warm MiniLM 11-14 and ~100 more context switches."""

    def __init__(self, store: Store, spans: "Sequence[Span | None]", window: int) -> None:
        self.store, self.spans, self.window = store, spans, window
        self._ends = list(itertools.accumulate((0 if s is None else s.fetched for s in spans), initial=0))
        self._read = 0      # spans [0, _read) are being read or done
        self._next = 0      # the next span to hint
        self._cold = False  # the reader met a span not in memory
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="deltackpt-read-ahead", daemon=True)
        self._thread.start()

    def _ahead(self) -> int:
        """Bytes hinted and not read yet (the caller holds the lock)."""
        return self._ends[max(self._next, self._read)] - self._ends[self._read]

    def reading(self, i: int) -> None:
        """The reader starts on span ``i``."""
        with self._cond:
            self._read = i + 1
            if self._cold and self._next < len(self.spans) and self._ahead() <= self.window // 2:
                self._cond.notify()

    def missing(self) -> None:
        """The reader found the bytes of the span it reads not in memory: the read is cold."""
        with self._cond:
            if not self._cold:
                self._cold = True
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        worker_threads.leave_signals_to_main()   # at the reader's priority (a drill's: idle), inherited
        n = len(self.spans)
        first = True   # the first round fills the window; later ones wait for half of it to be read, cold
        while True:
            with self._cond:
                while not (self._stop or self._next >= n or first
                           or (self._cold and self._ahead() <= self.window // 2)):
                    self._cond.wait()
                if self._stop or self._next >= n:
                    return
                self._next = max(self._next, self._read)
                batch: list[tuple[str, int, int]] = []
                while self._next < n and (not batch or self._ahead() + self._fetched(self._next) <= self.window):
                    span = self.spans[self._next]
                    self._next += 1
                    if span is not None:
                        batch.append((span.pack_id, span.start, span.length))
                        batch.extend(span.bases)
            first = False
            self._hint(batch)

    def _fetched(self, i: int) -> int:
        return self._ends[i + 1] - self._ends[i]

    def _hint(self, ranges: "list[tuple[str, int, int]]") -> None:
        """One hint per run of back-to-back (or overlapping) ranges of one pack (spans follow each
        other in a pack)."""
        for pid, start, length in _runs(ranges):
            self.store.prefetch(pack_key(pid), start, length)


def _runs(ranges: "list[tuple[str, int, int]]") -> "list[list]":
    """(pack id, start, length) ranges with each run of back-to-back (or overlapping) ranges of one
    pack, in the order given, merged into one."""
    merged: list[list] = []
    for pid, start, length in ranges:
        last = merged[-1] if merged else None
        if last is not None and last[0] == pid and last[1] <= start <= last[1] + last[2]:
            last[2] = max(last[2], start + length - last[1])   # back to back, or read twice
        else:
            merged.append([pid, start, length])
    return merged


def _anonymous(length: int) -> mmap.mmap:
    """Private zero-filled memory of ``length`` bytes in small pages, given back to the system on
    close (numpy would ask for huge pages, whose first touch costs more here: materialize._fresh;
    mmap's default for anonymous memory is shared, which the kernel backs with shmem)."""
    return mmap.mmap(-1, max(length, 1), flags=mmap.MAP_PRIVATE)
