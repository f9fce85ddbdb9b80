"""Everything a repository handle's background saves start and hold, in one owner.

A :class:`SaveRuntime` belongs to one :class:`deltackpt.Repo`: the thread that runs its
background saves (started when there is work, gone when there is none), the saves in flight, the
lazy snapshot copies still hooked into optimizers, the threads that fault staging memory in ahead
of need, the staging memory itself (:class:`.staging.StagingPool`) and, with
``BackgroundOptions(where="process")``, the encoder process.  :meth:`SaveRuntime.close` finishes
the saves in flight, frees the memory and joins every thread and process it started; nothing of it
runs afterwards.  Its settings are a :class:`BackgroundOptions`, passed in, never read from module
globals.

Example::

    runtime = SaveRuntime(session, BackgroundOptions(where="thread"))
    handle = async_save.submit(runtime, leaves, tree, write)
    handle.wait()
    runtime.close()
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from .. import priority, threads
from ..errors import InvalidArgumentError
from ..repo.write import encoder_process
from ..repo.write.session import WriteSession
from . import at_exit, prefault, staging
from .handle import SaveHandle, boost_unless_done


@dataclass(frozen=True)
class BackgroundOptions:
    """How a handle's background saves run (``deltackpt.Repo(..., background=...)``).

    ``where``: ``"thread"`` (a thread of this process) or ``"process"`` (a persistent encoder
    process fed through shared memory; local repositories and CPU tensors only, the rest use the
    thread).  ``idle``: run under ``SCHED_IDLE`` while nobody waits (:mod:`deltackpt.priority`;
    bench/ASYNC.md: the loop's run-queue wait per interval fell 4-7x).  ``nice``: a nice increment
    for the save thread instead (off: on 2 cores nice +10 made the loop slower, a starved save being
    still running when the next was due).  ``max_in_flight``: saves running at once; one more waits
    for the oldest.  ``prefault``: fault in the staging copies the next saves take right after the
    first save of a new layout (a process that saves once holds them for nothing until close).
    ``lazy_copy_idle``: run the lazy optimizer copy at idle priority too.  Off: an idle thread that
    holds the GIL between copies can be starved by torch's threads while the loop waits for the GIL;
    at idle, bench/async_stall.py (minilm-full, every 9 steps, 4 paired rounds) gave the lazy mode
    +4.2% [+1.4, +8.4] against +1.9% [+1.0, +3.0] for the plain thread save, at normal priority lazy
    and plain were within each other's intervals (bench/ASYNC.md).

    Example::

        repo = deltackpt.Repo("ckpt", background=BackgroundOptions(where="process", idle=False))
    """

    where: str = "thread"
    idle: bool = True
    nice: int | None = None
    max_in_flight: int = 1
    prefault: bool = True
    lazy_copy_idle: bool = False

    def __post_init__(self) -> None:
        if self.where not in ("thread", "process"):
            raise InvalidArgumentError(f"background must be 'thread' or 'process', got {self.where!r:.60}")
        if isinstance(self.max_in_flight, bool) or not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise InvalidArgumentError(f"max_in_flight must be an integer >= 1, got {self.max_in_flight!r:.60}")
        if self.nice is not None and (isinstance(self.nice, bool) or not isinstance(self.nice, int)):
            raise InvalidArgumentError(f"nice must be None or an integer, got {self.nice!r:.60}")


def background_options(value: "str | BackgroundOptions | None") -> BackgroundOptions:
    """``value`` as BackgroundOptions (a string names ``where``; None: the defaults)."""
    if value is None:
        return BackgroundOptions()
    if isinstance(value, BackgroundOptions):
        return value
    if isinstance(value, str):
        return BackgroundOptions(where=value)
    raise InvalidArgumentError(f"background must be 'thread', 'process' or a BackgroundOptions, got {value!r:.60}")


class SaveRuntime:
    """The owner of one handle's background work (see the module docstring)."""

    def __init__(self, session: WriteSession, options: BackgroundOptions) -> None:
        self.session = session
        self.options = options
        self.location = session.repo.location
        self.staging = staging.StagingPool(options.max_in_flight)
        self.streams: dict[Any, Any] = {}          # CUDA device -> side stream for lazy copies
        self._lock = threading.RLock()   # reentrant: the SIGTERM handler lists the pending saves from anywhere
        self._queue: deque[tuple[Callable[[], Any], Future]] = deque()
        self._worker: threading.Thread | None = None
        self._current: Future | None = None   # the job the worker is running (None between jobs)
        self._in_flight: list[SaveHandle] = []
        self._lazy: list[Any] = []                  # lazy copies whose optimizer hooks are still registered
        self._prefaults: dict[tuple, threading.Thread] = {}
        self._encoder: encoder_process.EncoderProcess | None = None
        self._closed = False
        self._freed = False
        self._on_idle: Callable[[], None] | None = None
        at_exit.track(self)

    # the save thread -------------------------------------------------------------------------
    def run(self, work: Callable[[], Any]) -> Future:
        """Queue ``work`` on the save thread (started if none runs; it ends once the queue is
        empty).  Jobs run one at a time, in order: saves commit in submission order, and the delta
        cache always holds the previous version's bytes.  At interpreter exit it runs inline."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise InvalidArgumentError(f"{self.location}: this repository handle is closed")
            if not at_exit.exiting():
                self._queue.append((work, future))
                if self._worker is None:
                    self._worker = threading.Thread(target=self._loop, name="deltackpt-save", daemon=True)
                    try:
                        self._worker.start()
                        return future
                    except RuntimeError:   # no new thread at interpreter shutdown
                        self._worker = None
                        self._queue.pop()
                else:
                    return future
        _settle(future, work)
        return future

    def _loop(self) -> None:
        threads.leave_signals_to_main()
        self._lower_priority()
        while True:
            with self._lock:
                on_idle, self._current = None, None
                if not self._queue:
                    on_idle, self._on_idle = self._on_idle, None
                    if on_idle is None:
                        self._worker = None   # from here on a new job starts a new thread
                        return
                else:
                    work, future = self._queue.popleft()
                    self._current = future
            if on_idle is not None:
                on_idle()   # still this runtime's worker meanwhile: join_idle waits for it
            else:
                _settle(future, work)

    def release_when_idle(self, release: Callable[[], None]) -> None:
        """Call ``release`` in the save thread once it has nothing left to do, just before it ends
        (a handle opened for one save frees its memory there: nobody is left to close it)."""
        with self._lock:
            if self._worker is not None:
                self._on_idle = release
                return
        release()

    def join_idle(self, finished: Future | None = None) -> None:
        """Join the save thread if it has nothing left to do but finish ``finished`` (it is about
        to end): once a wait returns, nothing of a finished save is still running.  A thread busy
        with a later save is left running: waiting for an earlier save must not wait for it."""
        with self._lock:
            idle = not self._queue and (self._current is None or self._current is finished)
            worker = self._worker if idle else None
        if worker is not None and worker is not threading.current_thread():
            worker.join()

    def _lower_priority(self) -> None:
        nice = self.options.nice
        if nice is None or not hasattr(os, "setpriority"):
            return
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except OSError:
            pass  # not permitted or not per-thread on this system: run at normal priority

    # saves in flight -------------------------------------------------------------------------
    def track(self, handle: SaveHandle) -> None:
        with self._lock:
            self._in_flight.append(handle)
        handle._runtime = self
        at_exit.track(self)

    def collect(self, handle: SaveHandle) -> None:
        """``handle`` was waited for: it no longer counts as in flight."""
        with self._lock:
            if handle in self._in_flight:
                self._in_flight.remove(handle)
        self._untrack_if_done()

    def _untrack_if_done(self) -> None:
        """Leave the process's record once released (or closed) with no save left to collect and
        no optimizer hook left to remove."""
        with self._lock:
            done = (self._closed or self._freed) and not self._in_flight and not self._lazy
        if done:
            at_exit.untrack(self)

    def pending(self) -> list[SaveHandle]:
        """Background saves of this handle not done yet."""
        with self._lock:
            return [h for h in self._in_flight if not h.done()]

    def drain(self, *, keep: int = 0) -> None:
        """Wait until at most ``keep`` saves are in flight; raise the first failure nobody has
        observed (so a background error surfaces at the next save).  A Ctrl-C during the wait is
        raised, and the save stays in flight for the exit to finish."""
        with self._lock:
            handles = list(self._in_flight)
        due = handles[: max(0, len(handles) - keep)]
        boost_unless_done(due)
        for h in due:
            exc = h._future.exception()
            self.collect(h)
            if exc is not None and not h._observed:
                h._observed = True
                raise exc

    def encoder(self) -> encoder_process.EncoderProcess:
        """The handle's encoder process (started, or restarted after it died, on first use)."""
        with self._lock:
            if self._encoder is None or not self._encoder.alive:
                if self._encoder is not None:
                    self._encoder.close()
                self._encoder = encoder_process.EncoderProcess()
            return self._encoder

    @property
    def encoder_started(self) -> encoder_process.EncoderProcess | None:
        """The encoder process if this handle started one (None otherwise)."""
        return self._encoder

    # lazy snapshot copies --------------------------------------------------------------------
    def add_lazy(self, copy: Any) -> None:
        with self._lock:
            self._lazy.append(copy)

    def forget_done_lazy(self) -> None:
        """Unhook the optimizers from lazy copies that have finished (from the caller's thread,
        between steps, where no optimizer is iterating its hooks)."""
        with self._lock:
            done = [d for d in self._lazy if d.done()]
            self._lazy = [d for d in self._lazy if d not in done]
        for d in done:
            d.remove_hooks()
        if done:
            self._untrack_if_done()

    def wait_snapshots(self) -> None:
        """Wait until every lazy snapshot copy of this handle is done (a restore does before it
        writes into live tensors); a copy's error is left to its save."""
        with self._lock:
            copies = list(self._lazy)
        for d in copies:
            try:
                d.wait()
            except BaseException:  # noqa: BLE001 - raised by the save's handle
                pass
        self.forget_done_lazy()

    # staging memory ahead of need ------------------------------------------------------------
    def prefault(self, leaves: list, shared_memory: bool, sets: int) -> threading.Thread | None:
        """Allocate and fault in ``sets`` staging copies for ``leaves`` in a thread of this runtime
        (once per layout), pooled where the next saves look first.  Returns the thread (None when
        there is nothing to do, or at interpreter exit)."""
        key = prefault.layout_key(leaves, shared_memory)
        with self._lock:
            if sets < 1 or key in self._prefaults or self._closed or at_exit.exiting():
                return self._prefaults.get(key)
            if len(self._prefaults) >= 8:   # layouts that keep changing: remember only recent ones
                for old in [k for k, t in self._prefaults.items() if not t.is_alive()]:
                    del self._prefaults[old]
            t = threading.Thread(target=prefault.fault_in, args=(self.staging, leaves, shared_memory, sets),
                                 name="deltackpt-prefault", daemon=True)
            try:
                t.start()
            except RuntimeError:   # no new thread at interpreter shutdown: the saves allocate their own
                return None
            self._prefaults[key] = t
            return t

    # the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the saves in flight, unhook finished lazy copies, free the staging memory and
        join every thread and process this runtime started.  Raises the first background error
        nobody observed (after releasing everything)."""
        with self._lock:
            if self._closed:
                return
        with self._lock:
            handles = list(self._in_flight)
        boost_unless_done(handles)
        error: BaseException | None = None
        for h in handles:   # a Ctrl-C here comes through: the saves stay for the exit to finish
            exc = h._future.exception()
            if exc is not None and not h._observed and error is None:
                h._observed = True
                error = exc
        with self._lock:
            self._in_flight = [h for h in self._in_flight if h not in handles]
        self.wait_snapshots()
        with self._lock:
            self._closed = True
            worker, prefaults = self._worker, list(self._prefaults.values())
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        for t in prefaults:
            t.join()
        self.release()
        at_exit.untrack(self)
        if error is not None:
            raise error

    def release(self) -> None:
        """Free the staging memory and end the encoder process (no thread is joined: this may run
        in the save thread itself, as its last act for a handle opened for one save)."""
        self._freed = True
        self.staging.release_all(self._encoder)
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        self._untrack_if_done()

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker): the parent's threads do not exist here, so
        nothing is waited for and nothing is closed."""
        self._lock = threading.RLock()
        self._queue.clear()
        self._worker = None
        self._in_flight = []
        self._lazy = []
        self._prefaults = {}
        self._encoder = None


def _settle(future: Future, work: Callable[[], Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(work())
    except BaseException as exc:  # noqa: BLE001 - the handle raises it, as from the thread
        future.set_exception(exc)


def spare_cores() -> int:
    """Encoder threads for a background save: the cores the training loop's torch threads leave
    free, at least one.  Measured on 2 cores with a 1-thread loop (bench/async_stall.py), two
    encoder threads there took the loop's core half the time."""
    import torch
    return max(1, min(4, (os.cpu_count() or 1) - torch.get_num_threads()))


def go_idle(options: BackgroundOptions, waited: threading.Event) -> None:
    """Enter SCHED_IDLE unless someone already waits for this save: a boost that came before this
    thread started must not be undone (at exit, on a loaded machine, an idle save may never run).
    Checked again after entering: a boost in between found this thread normal and left it."""
    priority.run_idle(options.idle and not waited.is_set())
    if waited.is_set():
        priority.run_idle(False)


def timed(work: Callable[[], Any], timing: dict[str, float]) -> Callable[[], Any]:
    def run() -> Any:
        start = time.perf_counter()
        try:
            return work()
        finally:
            timing["background"] = time.perf_counter() - start
    return run
