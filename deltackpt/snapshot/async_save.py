"""Background saves: the caller only waits for a host-memory snapshot of the tensors.

``deltackpt.save(state, repo, blocking=False)`` copies every tensor into staging buffers (pinned
host memory for CUDA tensors, copied with ``non_blocking`` and fenced by a CUDA event the
background thread waits on) and returns a :class:`SaveHandle`.  Hashing, deduplication (chunks
whose hash is already stored are not written), encoding and writing then run in the background.

Where (``BACKGROUND``): ``"thread"`` (default) runs them in one background thread of this
process; ``"process"`` in a persistent encoder process (:mod:`deltackpt.repo.write.encoder_process`),
the staging copy then being a shared ``memfd`` segment both processes map, so the save's Python
never holds the training loop's GIL and its allocations never fault pages in the training
process.  The process path takes local repositories and states in CPU memory; anything else
uses the thread.  On the 2-vCPU project machine the process costs a MiniLM fine-tune as much as
the thread or more (bench/ASYNC.md).  Every expensive step already runs in C with the GIL
released, so what the loop loses is the save's memory traffic and cores (below: ``Priority``),
and shared memory gets no huge pages there.  What the process does give: a save it has received
still commits if the training process is killed, and it keeps the save's Python off a
Python-bound loop's GIL.

Lazy snapshot (``optimizer=``, :mod:`.lazy`): the tensors an optimizer owns are copied after
the call returns, while the next forward and backward run; ``optimizer.step()`` waits for the copy
(a step pre-hook).  The caller then waits only for the rest (buffers, scheduler, scaler, RNG).

First save: staging memory is faulted in ahead of need (:mod:`.prefault`: by
``Checkpointer.prepare``, and after the first save of a new layout for the copy the next one takes).

Priority: on Linux a background save runs under ``SCHED_IDLE`` (``BACKGROUND_IDLE``), so its
threads never take a core the training loop is ready to use, and is put back to normal priority
as soon as anyone waits for it (:mod:`.priority`).  ``BACKGROUND_NICE`` can lower the priority of
the save thread by a nice increment instead (off by default, see its comment).  If a save is still
running when the next one is due, the next one waits for it (the loop stalls): saves more frequent
than the background time cost loop time.

Memory: at most ``MAX_IN_FLIGHT`` (default 1) saves are in flight; a save submitted while that
many are running first waits for the oldest.  A save's staging copy (its state's logical size)
stays lent to the repository's delta cache until the next save commits (:mod:`.staging`), so a
training loop saving in the background holds ``MAX_IN_FLIGHT + 1`` staging copies of its state
(the delta cache views them instead of holding its own copy), plus a window of encoded chunks
(16 chunks of at most ``chunk_bytes`` each).

Errors: a failed background save raises its exception from :meth:`SaveHandle.wait`, or, when
nobody waited for it, from the next save to the same repository (which then does not start).

Exit, Ctrl-C and SIGTERM (:mod:`.at_exit`): the interpreter's exit (normal, ``sys.exit``, an
uncaught exception or Ctrl-C) finishes the saves in flight, saying so on stderr; while one is
pending, SIGTERM stops the script the same way (exit status 143).  A second Ctrl-C abandons them,
leaving nothing partial.  The encoder process ignores the terminal's SIGINT, so a save it received
commits even if the training process dies.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from .. import priority, threads
from ..repo.write import encoder_process
from ..repo.versions import Version
from . import at_exit, lazy, prefault, staging
from .handle import SaveHandle, boost_unless_done


MAX_IN_FLIGHT = 1

BACKGROUND = "thread"
"""Where a background save hashes, encodes and writes: ``"thread"`` (a thread of this process)
or ``"process"`` (a persistent encoder process fed through shared memory; see
:mod:`deltackpt.repo.write.encoder_process`)."""

_executor: ThreadPoolExecutor | None = None
_lock = threading.RLock()   # reentrant: the SIGTERM handler lists the pending saves from whatever the main thread was doing
_in_flight: dict[int, list["SaveHandle"]] = {}   # id(Repository) -> handles not yet collected
_encoder: encoder_process.EncoderProcess | None = None
_lazy: list["lazy.LazyCopy"] = []                # lazy copies whose optimizer hooks are still registered


BACKGROUND_IDLE = True
"""Run background saves under SCHED_IDLE where the platform allows leaving it again, boosted back
to normal priority when waited for (:mod:`.priority`).  Measured on the 2-vCPU project machine
(bench/ASYNC.md, minilm-full every 8 steps): the loop's run-queue wait per checkpoint interval fell
4-7x, and its slowdown from +2.3..+5.5% to +0.1..+3.1% (torch.save: +8.6..+11.5%)."""

BACKGROUND_NICE: int | None = None
"""Nice increment for the save thread (Linux: per thread; its encoder threads inherit it); set it
before the first background save.  Off by default: on the 2-core shared project machine nice +10
made the loop slower, not faster (bench/async_stall.py, same run, 271 MB MiniLM+AdamW state every
4 steps: +33% loop time and a stall of 0.42x torch.save at nice 10 against +0.7% and 0.13x at
nice 0), because a starved save was still running when the next one was due and the loop waited."""


def spare_cores() -> int:
    """Encoder threads for a background save: the cores the training loop's torch threads leave
    free, at least one.  Measured on 2 cores with a 1-thread loop (bench/async_stall.py), two
    encoder threads there took the loop's core half the time."""
    return max(1, min(4, (os.cpu_count() or 1) - torch.get_num_threads()))


def _lower_priority() -> None:
    threads.leave_signals_to_main()
    if BACKGROUND_NICE is None or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except OSError:
        pass  # not permitted or not per-thread on this system: run at normal priority


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        # one worker: saves to a repository commit in submission order, and the delta cache
        # (keyed by chunk position) always holds the previous version's bytes
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltackpt-save",
                                       initializer=_lower_priority)
    return _executor


def drain(core: Any, *, keep: int = 0) -> None:
    """Wait until at most ``keep`` saves to ``core`` are in flight; raise the first failure that
    nobody has observed (so a background error surfaces at the next save)."""
    with _lock:
        handles = list(_in_flight.get(id(core), []))
    due = handles[: max(0, len(handles) - keep)]
    boost_unless_done(due)
    for h in due:
        # the save's own error, returned; a Ctrl-C during the wait is raised, and the save stays
        # in flight for the exit to finish
        exc = h._future.exception()
        with _lock:
            lst = _in_flight.get(id(core), [])
            if h in lst:
                lst.remove(h)
        if exc is not None and not h._observed:
            h._observed = True
            raise exc


def drain_all() -> None:
    """Wait for every background save of this process (errors are left to their handles)."""
    with _lock:
        handles = [h for lst in _in_flight.values() for h in lst]
    boost_unless_done(handles)
    for h in handles:
        h._future.exception()   # a Ctrl-C during the wait comes through; a save's error is its handle's


def _encoder_process() -> encoder_process.EncoderProcess:
    global _encoder
    with _lock:
        if _encoder is None or not _encoder.alive:
            _encoder = encoder_process.EncoderProcess()
            atexit.register(_encoder.close)
        return _encoder


def on_repo_close(core: Any) -> None:
    """``Repo.close``: give back the staging memory lent to ``core``'s delta cache, and drop the
    encoder process's handle on the repository."""
    staging.release_lent(core, _encoder, MAX_IN_FLIGHT)
    if _encoder is not None:
        # after any save to it already sent: the child serves one message at a time, in order
        _encoder.close_repo(core.location)


def uses_process(core: Any, leaves: list, background: str | None = None) -> bool:
    """Whether a background save of ``leaves`` to repository ``core`` runs in the encoder process: when asked
    (``background``, else ``BACKGROUND``), on a local repository, for a state held in CPU memory
    (CUDA tensors stay on the thread path, which copies them into pinned memory without blocking)."""
    from ..store.local import LocalStore
    return ((background or BACKGROUND) == "process" and encoder_process.supported() and isinstance(core.store, LocalStore)
            and all(leaf.tensor.device.type == "cpu" for leaf in leaves))


def submit(core: Any, leaves: list, tree: Any, write: Callable[..., Version],
           after: Callable[[Version], None] | None = None, background: str | None = None,
           optimizers: list | None = None) -> SaveHandle:
    """Snapshot ``leaves`` now and run ``write(staged_leaves, tree, encoder=..., segment=...,
    owner=...)`` (then ``after(version)``) in the background; ``encoder`` and ``segment`` are None
    on the thread path, ``owner`` marks the staging memory lent to the delta cache.  Used by
    :func:`deltackpt.save` with ``blocking=False``.  ``optimizers``: the tensors they own are
    copied lazily (:mod:`.lazy`), the rest now."""
    drain(core, keep=MAX_IN_FLIGHT - 1)
    _forget_done_lazy()
    t0 = time.perf_counter()
    lazy_keys = lazy.owned_storages(optimizers) if optimizers else None
    shared_memory = uses_process(core, leaves, background)
    fresh = staging.fresh_bytes()
    staged, memory, event, (host, cuda) = staging.stage(core, leaves, shared_memory=shared_memory,
                                                        lazy_keys=lazy_keys)
    if staging.fresh_bytes() > fresh and prefault.AFTER_FIRST_SAVE:
        # a state of a new size: fault in the other staging copies a loop saving it holds
        # (MAX_IN_FLIGHT + 1 with the delta cache) now, in the background, not at the next save
        prefault.prepare(leaves, shared_memory, prefault.sets_for(core, MAX_IN_FLIGHT) - 1)
    deferred = (lazy.LazyCopy(host, cuda, optimizers or [], BACKGROUND_IDLE and lazy.COPY_IDLE,
                              lambda pairs: staging.copy_host(pairs, threads=spare_cores()))
                if host or cuda else None)
    if deferred is not None:
        with _lock:
            _lazy.append(deferred)
    stall = time.perf_counter() - t0
    timing: dict[str, float] = {}

    waited = threading.Event()

    def work() -> Version:
        start = time.perf_counter()
        ok = False
        _go_idle(waited)
        try:
            if event is not None:
                event.synchronize()
            if deferred is not None:
                deferred.wait()
            encoder = _encoder_process() if memory.segment is not None else None
            version = write(staged, tree, encoder=encoder, segment=memory.segment, owner=memory.owner)
            ok = True
            if after is not None:
                after(version)
            return version
        finally:
            staged.clear()
            staging.settle(memory, ok, _encoder, MAX_IN_FLIGHT)
            timing["background"] = time.perf_counter() - start

    return _start(core, work, memory.nbytes, stall, timing, deferred, waited)


def _go_idle(waited: threading.Event) -> None:
    """Enter SCHED_IDLE unless someone already waits for this save: a boost that came before this
    thread started must not be undone (at exit, on a loaded machine, an idle save may never run).
    Checked again after entering: a boost in between found this thread normal and left it."""
    priority.run_idle(BACKGROUND_IDLE and not waited.is_set())
    if waited.is_set():
        priority.run_idle(False)


def _start(core: Any, work: Callable[[], Any], nbytes: int, stall: float, timing: dict[str, float],
           deferred: "lazy.LazyCopy | None" = None, waited: threading.Event | None = None) -> SaveHandle:
    """Queue ``work`` on the save thread and track its handle until someone collects it."""
    at_exit.arm_sigterm()
    with _lock:  # with release_idle_thread: never submitted to an executor being shut down
        try:
            future = _pool().submit(work)
        except RuntimeError:
            future = None  # the interpreter is exiting (a save made by an atexit handler): no new thread
        if future is not None:
            handle = SaveHandle(future, nbytes, stall, timing, deferred, waited)
            _in_flight.setdefault(id(core), []).append(handle)
            return handle
    done: Future = Future()
    try:
        done.set_result(work())
    except BaseException as exc:  # noqa: BLE001 - the handle raises it, as from the thread
        done.set_exception(exc)
    return SaveHandle(done, nbytes, stall, timing, deferred)


def _pending() -> list[SaveHandle]:
    with _lock:
        return [h for lst in _in_flight.values() for h in lst if not h.done()]


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) has the handles but no save thread: never wait for them."""
    global _executor, _encoder, _lock
    _lock = threading.RLock()
    _in_flight.clear()
    _lazy.clear()
    _executor = None
    if _encoder is not None:
        atexit.unregister(_encoder.close)
        _encoder = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
at_exit.install(_pending, boost_unless_done)


def wait_snapshots() -> None:
    """Wait until every lazy snapshot copy of this process is done (:func:`deltackpt.restore`
    does, before it writes into live tensors); a copy's error is left to its save."""
    with _lock:
        pending = list(_lazy)
    for d in pending:
        try:
            d.wait()
        except BaseException:  # noqa: BLE001 - raised by the save's handle
            pass
    _forget_done_lazy()


def _forget_done_lazy() -> None:
    """Unhook the optimizers from lazy copies that have finished (from the caller's thread,
    between steps, where no optimizer is iterating its hooks)."""
    with _lock:
        done = [d for d in _lazy if d.done()]
        _lazy[:] = [d for d in _lazy if d not in done]
    for d in done:
        d.remove_hooks()


def run_after(core: Any, fn: Callable[[], Any]) -> SaveHandle:
    """Queue ``fn`` on the save thread, after every save already submitted (the Checkpointer's
    gc).  Its error surfaces like a save's: at the next save or wait."""
    timing: dict[str, float] = {}
    waited = threading.Event()

    def work() -> Any:
        start = time.perf_counter()
        _go_idle(waited)
        try:
            return fn()
        finally:
            timing["background"] = time.perf_counter() - start

    return _start(core, work, 0, 0.0, timing, None, waited)


def release_idle_thread() -> bool:
    """Stop the save thread if no save is running or queued (a framework's teardown: no thread of
    ours outlives the run); the next background save starts a new one.  Returns whether it stopped."""
    global _executor
    with _lock:
        if _executor is None or any(not h.done() for lst in _in_flight.values() for h in lst):
            return False
        done, _executor = _executor, None
    done.shutdown(wait=True)  # idle: its worker exits at once
    return True
