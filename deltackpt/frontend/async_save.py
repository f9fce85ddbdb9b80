"""Background saves: the caller only waits for a host-memory snapshot of the tensors.

``deltackpt.save(state, repo, blocking=False)`` copies every tensor into staging buffers (pinned
host memory for CUDA tensors, copied with ``non_blocking`` and fenced by a CUDA event the
background thread waits on) and returns a :class:`SaveHandle`.  Hashing, deduplication (chunks
whose hash is already stored are not written), encoding and writing then run in one background
thread of this process.

Why a thread and not a process: every expensive step of the background work (xxh3 over large
buffers, zstd, numpy XOR, file writes and fsync) runs in C with the GIL released, so a training
loop loses little to the GIL (bench/async_stall.py measures it against a forked writer process:
see the figures in its output).  A thread also keeps the repository handle's delta cache (the
previous version's bytes, against which deltas are computed) in the same address space; a
process would have to receive every byte through shared memory and keep its own cache.

Priority: ``BACKGROUND_NICE`` can run the save thread at a lower CPU priority (Linux); off by
default, see its comment for the measurement.  If a save is still running when the next one is
due, the next one waits for it (the loop stalls): saves more frequent than the background time
cost loop time.

Memory: at most ``MAX_IN_FLIGHT`` (default 1) saves are in flight; a save submitted while that
many are running first waits for the oldest.  Each in-flight save holds one staging copy of the
state (its logical size); staging buffers are reused by the next save of the same shapes, so a
training loop holds at most ``MAX_IN_FLIGHT`` x state size of staging memory, plus the
repository's delta cache (``Repo(..., delta_cache_bytes=...)``, default at most 4 GiB) and a
window of encoded chunks (16 chunks of at most ``chunk_bytes`` each).

Errors: a failed background save raises its exception from :meth:`SaveHandle.wait`, or, when
nobody waited for it, from the next save to the same repository (which then does not start).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..repo.versions import Version

if TYPE_CHECKING:
    from .api import Repo

MAX_IN_FLIGHT = 1

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_in_flight: dict[int, list["SaveHandle"]] = {}   # id(Repository) -> handles not yet collected
_staging: dict[tuple, list[torch.Tensor]] = {}   # (shape, dtype, pinned) -> free buffers
_staging_bytes = 0


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


class SaveHandle:
    """A save running in the background.

    Example::

        h = deltackpt.save(state, "ckpt", step=step, blocking=False)
        ...                      # keep training: the state may change now
        version = h.wait()       # the committed Version, or the save's exception
    """

    def __init__(self, future: "Future[Version]", staged_bytes: int, stall_seconds: float,
                 timing: dict[str, float]) -> None:
        self._future = future
        self._observed = False
        self._timing = timing
        self.staged_bytes = staged_bytes
        """Bytes of host memory this save holds until it finishes."""
        self.stall_seconds = stall_seconds
        """Seconds the caller was blocked (snapshot of the tensors)."""

    @property
    def background_seconds(self) -> float | None:
        """Seconds of background work (hash, encode, write, commit), once done."""
        return self._timing.get("background")

    def done(self) -> bool:
        """True when the save has committed or failed."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Version:
        """Block until the version is committed and return it; re-raise the save's exception."""
        self._observed = True
        return self._future.result(timeout)

    def exception(self) -> BaseException | None:
        return self._future.exception() if self._future.done() else None

    def __repr__(self) -> str:
        return f"SaveHandle(done={self.done()}, staged_bytes={self.staged_bytes})"


def drain(core: Any, *, keep: int = 0) -> None:
    """Wait until at most ``keep`` saves to ``core`` are in flight; raise the first failure that
    nobody has observed (so a background error surfaces at the next save)."""
    with _lock:
        handles = list(_in_flight.get(id(core), []))
    for h in handles[: max(0, len(handles) - keep)]:
        exc = None
        try:
            h._future.result()
        except BaseException as e:  # noqa: BLE001 - re-raised below unless already seen
            exc = e
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
    for h in handles:
        try:
            h._future.result()
        except BaseException:  # noqa: BLE001
            pass


def _take(shape: torch.Size, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    global _staging_bytes
    with _lock:
        free = _staging.get((tuple(shape), dtype, pinned))
        if free:
            t = free.pop()
            _staging_bytes -= t.numel() * t.element_size()
            return t
    return torch.empty(shape, dtype=dtype, pin_memory=pinned)


def _give_back(buffers: list[torch.Tensor], pinned: list[bool]) -> None:
    global _staging_bytes
    nbytes = sum(t.numel() * t.element_size() for t in buffers)
    with _lock:
        if _staging_bytes + nbytes > MAX_IN_FLIGHT * nbytes:
            # buffers of older shapes nobody reused: keep at most MAX_IN_FLIGHT states' worth
            _staging.clear()
            _staging_bytes = 0
        for t, p in zip(buffers, pinned):
            _staging.setdefault((tuple(t.shape), t.dtype, p), []).append(t)
        _staging_bytes += nbytes


def snapshot(leaves: list) -> tuple[list, list[torch.Tensor], list[bool], Any]:
    """Copy each leaf's tensor into host staging memory; tensors sharing a storage are copied as
    one storage and rebuilt as views of it, so sharing survives.  Returns (new leaves, staging
    buffers, pinned flags, CUDA event to wait on or None)."""
    from .flatten import TensorLeaf

    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        t = leaf.tensor
        if t.untyped_storage().nbytes():
            groups.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(i)
    shared = {i: g for g in groups.values() if len(g) > 1 for i in g}
    out: list = [None] * len(leaves)
    buffers: list[torch.Tensor] = []
    pinned: list[bool] = []
    storage_copy: dict[int, torch.Tensor] = {}
    cuda_used = False
    with torch.no_grad():
        for i, leaf in enumerate(leaves):
            t = leaf.tensor
            on_cuda = t.device.type == "cuda"
            cuda_used |= on_cuda
            pin = on_cuda and torch.cuda.is_available()
            group = shared.get(i)
            if group is None:
                dst = _take(t.shape, t.dtype, pin)
                dst.copy_(t, non_blocking=pin)
                buffers.append(dst)
                pinned.append(pin)
                out[i] = TensorLeaf(leaf.index, leaf.key, leaf.name, dst)
                continue
            gid = group[0]
            if gid not in storage_copy:
                src = t.untyped_storage()
                raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(src)
                dst = _take(raw.shape, torch.uint8, pin)
                dst.copy_(raw, non_blocking=pin)
                buffers.append(dst)
                pinned.append(pin)
                storage_copy[gid] = dst
            base = storage_copy[gid]
            view = torch.empty(0, dtype=t.dtype).set_(base.untyped_storage(), t.storage_offset(), t.shape, t.stride())
            out[i] = TensorLeaf(leaf.index, leaf.key, leaf.name, view)
    event = None
    if cuda_used and torch.cuda.is_available():
        event = torch.cuda.Event()
        event.record()
    return out, buffers, pinned, event


def submit(repo: "Repo", leaves: list, tree: Any, write: Callable[[list, Any], Version],
           after: Callable[[Version], None] | None = None) -> SaveHandle:
    """Snapshot ``leaves`` now and run ``write(staged_leaves, tree)`` (then ``after(version)``)
    in the background.  Used by :func:`deltackpt.save` with ``blocking=False``."""
    core = repo.core
    drain(core, keep=MAX_IN_FLIGHT - 1)
    t0 = time.perf_counter()
    staged, buffers, pinned, event = snapshot(leaves)
    stall = time.perf_counter() - t0
    nbytes = sum(b.numel() * b.element_size() for b in buffers)
    timing: dict[str, float] = {}

    def work() -> Version:
        start = time.perf_counter()
        try:
            if event is not None:
                event.synchronize()
            version = write(staged, tree)
            if after is not None:
                after(version)
            return version
        finally:
            staged.clear()
            _give_back(buffers, pinned)
            buffers.clear()
            timing["background"] = time.perf_counter() - start

    handle = SaveHandle(_pool().submit(work), nbytes, stall, timing)
    with _lock:
        _in_flight.setdefault(id(core), []).append(handle)
    return handle


def run_after(core: Any, fn: Callable[[], Any]) -> SaveHandle:
    """Queue ``fn`` on the save thread, after every save already submitted (the Checkpointer's
    gc).  Its error surfaces like a save's: at the next save or wait."""
    timing: dict[str, float] = {}

    def work() -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            timing["background"] = time.perf_counter() - start

    handle = SaveHandle(_pool().submit(work), 0, 0.0, timing)
    with _lock:
        _in_flight.setdefault(id(core), []).append(handle)
    return handle
