"""Background saves: the caller only waits for a host-memory snapshot of the tensors.

``deltackpt.save(state, repo, blocking=False)`` copies every tensor into staging buffers (pinned
host memory for CUDA tensors, copied with ``non_blocking`` and fenced by a CUDA event the
background thread waits on) and returns a :class:`SaveHandle`.  Hashing, deduplication (chunks
whose hash is already stored are not written), encoding and writing then run in the background.

Where (``BackgroundOptions.where``, or ``save(..., background=...)``): ``"thread"`` (default)
runs them in the handle's save thread; ``"process"`` in a persistent encoder process (:mod:`deltackpt.repo.write.encoder_process`),
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

Priority: on Linux a background save runs under ``SCHED_IDLE`` (``BackgroundOptions.idle``), so
its threads never take a core the training loop is ready to use, and is put back to normal
priority as soon as anyone waits for it (:mod:`.priority`).  ``BackgroundOptions.nice`` can lower
the priority of the save thread by a nice increment instead (off by default).  If a save is still
running when the next one is due, the next one waits for it (the loop stalls): saves more frequent
than the background time cost loop time.

Who owns what: everything a background save starts belongs to its repository handle's
:class:`~.runtime.SaveRuntime` (its thread, the staging memory, lazy copies, pre-faulting, the
encoder process), and ``Repo.close()`` ends all of it.  A save to a path (``deltackpt.save(state,
"ckpt", blocking=False)``) opens a handle of its own, which the returned SaveHandle closes when
waited for; its thread ends by itself once the save is done.

Memory: at most ``BackgroundOptions.max_in_flight`` (default 1) saves are in flight; a save submitted while that
many are running first waits for the oldest.  A save's staging copy (its state's logical size)
goes back to the handle's pool when the save is done, for the next snapshot to reuse (faulted-in
pages), so a training loop saving in the background holds ``max_in_flight`` staging copies of its
state, plus the delta cache's bytes (within ``delta_cache_bytes``: only positions whose last change
was a delta keep theirs) and a window of encoded chunks (16 chunks of at most ``chunk_bytes``).

Errors: a failed background save raises its exception from :meth:`SaveHandle.wait`, or, when
nobody waited for it, from the next save to the same repository (which then does not start), or
from ``Repo.close()``.

Exit, Ctrl-C and SIGTERM (:mod:`.at_exit`): the interpreter's exit (normal, ``sys.exit``, an
uncaught exception or Ctrl-C) finishes the saves in flight, saying so on stderr; while one is
pending, SIGTERM stops the script the same way (exit status 143).  A second Ctrl-C abandons them,
leaving nothing partial.  The encoder process ignores the terminal's SIGINT, so a save it received
commits even if the training process dies.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..repo.versions import Version
from . import at_exit, host_copy, lazy, staging
from .handle import SaveHandle as SaveHandle

from .runtime import SaveRuntime, go_idle, spare_cores, timed


def uses_process(runtime: SaveRuntime, leaves: list, where: str | None = None) -> bool:
    """Whether a background save of ``leaves`` runs in the encoder process: when asked (``where``,
    else the handle's ``BackgroundOptions.where``), on a local repository, for a state held in CPU
    memory (CUDA tensors stay on the thread path, which copies them into pinned memory without
    blocking)."""
    from ..repo.write import encoder_process
    from ..store.local import LocalStore
    return ((where or runtime.options.where) == "process" and encoder_process.supported()
            and isinstance(runtime.session.store, LocalStore) and all(leaf.tensor.device.type == "cpu" for leaf in leaves))


def wait_for_others(runtime: SaveRuntime) -> None:
    """Wait for the background saves other handles of this process have in flight to the same
    repository, so that versions commit in the order they were saved; raise one nobody observed."""
    for other in at_exit.others_for(runtime.location, runtime):
        other.drain()


def submit(runtime: SaveRuntime, leaves: list, tree: Any, write: Callable[..., Version], *,
           where: str | None = None, optimizers: list | None = None) -> SaveHandle:
    """Snapshot ``leaves`` now and run ``write(staged_leaves, tree, encoder=..., segment=...)`` in
    the background on ``runtime``; ``encoder`` and ``segment`` are None on the thread path.  Used by
    :func:`deltackpt.save` with ``blocking=False``.  ``optimizers``: the tensors they own are
    copied lazily (:mod:`.lazy`), the rest now."""
    wait_for_others(runtime)
    runtime.drain(keep=runtime.options.max_in_flight - 1)
    for r in at_exit.runtimes():   # the caller's thread, between steps: unhook finished lazy copies
        r.forget_done_lazy()       # of any handle (they hook the user's optimizers, not the handle)
    t0 = time.perf_counter()
    lazy_keys = lazy.owned_storages(optimizers) if optimizers else None
    shared_memory = uses_process(runtime, leaves, where)
    fresh = runtime.staging.fresh_bytes
    staged, memory, event, (host, cuda) = staging.stage(runtime.staging, leaves, shared_memory=shared_memory,
                                                        lazy_keys=lazy_keys)
    if runtime.staging.fresh_bytes > fresh and runtime.options.prefault:
        # a state of a new size: fault in the other staging copies a loop saving it holds
        # (max_in_flight) now, in the background, not at the next save
        runtime.prefault(leaves, shared_memory, runtime.options.max_in_flight - 1)
    deferred = None
    if host or cuda:
        deferred = lazy.LazyCopy(host, cuda, optimizers or [], runtime.options.idle and runtime.options.lazy_copy_idle,
                                 lambda pairs: host_copy.copy_host(pairs, threads=spare_cores()), runtime.streams)
        runtime.add_lazy(deferred)
    stall = time.perf_counter() - t0
    timing: dict[str, float] = {}
    waited = threading.Event()

    def work() -> Version:
        go_idle(runtime.options, waited)
        try:
            if event is not None:
                event.synchronize()
            if deferred is not None:
                deferred.wait()
            encoder = runtime.encoder() if memory.segment is not None else None
            return write(staged, tree, encoder=encoder, segment=memory.segment)
        finally:
            staged.clear()
            runtime.staging.release(memory, runtime.encoder_started)

    return _start(runtime, timed(work, timing), memory.nbytes, stall, timing, deferred, waited)


def run_after(runtime: SaveRuntime, fn: Callable[[], Any]) -> SaveHandle:
    """Queue ``fn`` on the handle's save thread, after every save already submitted (a
    Checkpointer's gc, a drill, a framework's pointer file).  Its error surfaces like a save's: at
    the next save, wait or close."""
    timing: dict[str, float] = {}
    waited = threading.Event()

    def work() -> Any:
        go_idle(runtime.options, waited)
        return fn()

    return _start(runtime, timed(work, timing), 0, 0.0, timing, None, waited)


def _start(runtime: SaveRuntime, work: Callable[[], Any], nbytes: int, stall: float, timing: dict[str, float],
           deferred: "lazy.LazyCopy | None" = None, waited: threading.Event | None = None) -> SaveHandle:
    """Queue ``work`` on the save thread and track its handle until someone collects it."""
    at_exit.arm_sigterm()
    handle = SaveHandle(runtime.run(work), nbytes, stall, timing, deferred, waited)
    runtime.track(handle)
    return handle
