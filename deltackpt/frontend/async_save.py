"""Background saves: the caller only waits for a host-memory snapshot of the tensors.

``deltackpt.save(state, repo, blocking=False)`` copies every tensor into staging buffers (pinned
host memory for CUDA tensors, copied with ``non_blocking`` and fenced by a CUDA event the
background thread waits on) and returns a :class:`SaveHandle`.  Hashing, deduplication (chunks
whose hash is already stored are not written), encoding and writing then run in the background.

Where (``BACKGROUND``): ``"thread"`` (default) runs them in one background thread of this
process; ``"process"`` in a persistent encoder process (:mod:`deltackpt.repo.encoder_process`),
the staging copy then being a shared ``memfd`` segment both processes map, so the save's Python
never holds the training loop's GIL and its allocations never fault pages in the training
process.  The process path takes local repositories and states in CPU memory; anything else
uses the thread.  On the 2-vCPU project machine the process costs a MiniLM fine-tune as much as
the thread or more (bench/ASYNC.md).  Every expensive step already runs in C with the GIL
released, so what the loop loses is the save's memory traffic, and shared memory gets no huge
pages there.  What the process does give: a save it has received still commits if the training
process is killed, and it keeps the save's Python off a Python-bound loop's GIL.

Priority: ``BACKGROUND_NICE`` can run the save thread at a lower CPU priority (Linux); off by
default, see its comment for the measurement.  If a save is still running when the next one is
due, the next one waits for it (the loop stalls): saves more frequent than the background time
cost loop time.

Memory: at most ``MAX_IN_FLIGHT`` (default 1) saves are in flight; a save submitted while that
many are running first waits for the oldest.  A save's staging copy (its state's logical size)
stays lent to the repository's delta cache after it commits: the next save computes its deltas
against it, so the saver copies nothing.  It returns to the pool when the next save commits, and
the save after that copies into it.  A training loop saving in the background therefore holds
``MAX_IN_FLIGHT + 1`` staging copies of its state, the delta cache views them instead of holding
its own copy, plus a window of encoded chunks (16 chunks of at most ``chunk_bytes`` each).

Errors: a failed background save raises its exception from :meth:`SaveHandle.wait`, or, when
nobody waited for it, from the next save to the same repository (which then does not start).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..repo import encoder_process
from ..repo.versions import Version

if TYPE_CHECKING:
    from .api import Repo

MAX_IN_FLIGHT = 1

BACKGROUND = "thread"
"""Where a background save hashes, encodes and writes: ``"thread"`` (a thread of this process)
or ``"process"`` (a persistent encoder process fed through shared memory; see
:mod:`deltackpt.repo.encoder_process`)."""

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_in_flight: dict[int, list["SaveHandle"]] = {}   # id(Repository) -> handles not yet collected
_staging: dict[tuple, list[torch.Tensor]] = {}   # (shape, dtype, pinned) -> free buffers
_staging_bytes = 0
_segments: list[encoder_process.SharedSegment] = []   # free staging segments (process mode)
_encoder: encoder_process.EncoderProcess | None = None
ALIGN = 64  # staged tensors start on cache-line boundaries (and on any element size)


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
        """Bytes of host memory this save's staging copy takes (lent to the delta cache until the
        next save commits)."""
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


def _sharing(leaves: list) -> dict[int, list[int]]:
    """Leaf index -> the leaves sharing its storage (only for storages shared by several)."""
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        t = leaf.tensor
        if t.untyped_storage().nbytes():
            groups.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(i)
    return {i: g for g in groups.values() if len(g) > 1 for i in g}


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _segment_allocator(leaves: list, shared: dict[int, list[int]]):
    """A staging segment big enough for ``leaves`` (reused from an earlier save when one is free)
    and an allocator that carves it, in snapshot order, into contiguous tensors."""
    total = 0
    for i, leaf in enumerate(leaves):
        group = shared.get(i)
        if group is None:
            total += _aligned(leaf.tensor.numel() * leaf.tensor.element_size())
        elif group[0] == i:
            total += _aligned(leaf.tensor.untyped_storage().nbytes())
    with _lock:
        fits = [s for s in _segments if s.size >= total]
        seg = min(fits, key=lambda s: s.size) if fits else None
        if seg is not None:
            _segments.remove(seg)
    if seg is None:
        seg = encoder_process.SharedSegment(total)
        seg.tensor = torch.frombuffer(seg.map, dtype=torch.uint8)
    pos = 0

    def alloc(shape: torch.Size, dtype: torch.dtype, pin: bool) -> torch.Tensor:
        nonlocal pos
        itemsize = torch.empty(0, dtype=dtype).element_size()
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * max(1, shape[d + 1])
        out = torch.empty(0, dtype=dtype).set_(seg.tensor.untyped_storage(), pos // itemsize, shape, strides)
        n = 1
        for d in shape:
            n *= d
        pos += _aligned(n * itemsize)
        return out

    return seg, alloc


def _give_back_segment(seg: encoder_process.SharedSegment) -> None:
    with _lock:
        _segments.append(seg)
        # keep at most MAX_IN_FLIGHT segments: the largest (the state grew; older ones are too small)
        _segments.sort(key=lambda s: s.size, reverse=True)
        extra = _segments[MAX_IN_FLIGHT:]
        del _segments[MAX_IN_FLIGHT:]
    for s in extra:
        if _encoder is not None:
            _encoder.forget(s)
        s.close()


PARALLEL_COPY_BYTES = 16 << 20
"""A snapshot at least this large is copied by two threads when the machine has a core the training
loop's torch threads leave free.  Memory-bound, but measured 20-30% faster on the 2-vCPU project
machine (271 MB: 43 ms -> 31-38 ms), and the stall is the one part of a background save the loop
waits for.  The other core is idle then: the previous save has finished (at most MAX_IN_FLIGHT)."""

_copier: ThreadPoolExecutor | None = None


def _copy_list(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():   # thread-local (flatten detaches leaves; this keeps any other caller safe)
        for dst, src in pairs:
            dst.copy_(src)


def _copy_all(copies: list[tuple[torch.Tensor, torch.Tensor, bool]]) -> None:
    global _copier
    for dst, src, pin in copies:
        if pin:   # device -> pinned host: queued on the CUDA stream, fenced by the caller's event
            dst.copy_(src, non_blocking=True)
    host = [(dst, src) for dst, src, pin in copies if not pin]
    total = sum(dst.numel() * dst.element_size() for dst, _ in host)
    if total < PARALLEL_COPY_BYTES or (os.cpu_count() or 1) <= torch.get_num_threads() or len(host) < 2:
        _copy_list(host)
        return
    acc, cut = 0, len(host)
    for k, (dst, _) in enumerate(host):
        acc += dst.numel() * dst.element_size()
        if acc >= total / 2:
            cut = k + 1
            break
    if _copier is None:
        _copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltackpt-snapshot")
    other = _copier.submit(_copy_list, host[cut:])
    _copy_list(host[:cut])
    other.result()


def snapshot(leaves: list, alloc: Callable[[torch.Size, torch.dtype, bool], torch.Tensor] | None = None,
             shared: dict[int, list[int]] | None = None) -> tuple[list, list[torch.Tensor], list[bool], Any]:
    """Copy each leaf's tensor into host staging memory; tensors sharing a storage are copied as
    one storage and rebuilt as views of it, so sharing survives.  Returns (new leaves, staging
    buffers, pinned flags, CUDA event to wait on or None).  ``alloc``: where the copies go
    (default: reusable per-shape buffers, pinned for CUDA tensors)."""
    from .flatten import TensorLeaf

    alloc = alloc or _take
    shared = _sharing(leaves) if shared is None else shared
    out: list = [None] * len(leaves)
    buffers: list[torch.Tensor] = []
    pinned: list[bool] = []
    storage_copy: dict[int, torch.Tensor] = {}
    copies: list[tuple[torch.Tensor, torch.Tensor, bool]] = []   # (staging, source, pinned)
    cuda_used = False
    with torch.no_grad():
        for i, leaf in enumerate(leaves):
            t = leaf.tensor
            on_cuda = t.device.type == "cuda"
            cuda_used |= on_cuda
            pin = on_cuda and torch.cuda.is_available()
            group = shared.get(i)
            if group is None:
                dst = alloc(t.shape, t.dtype, pin)
                copies.append((dst, t, pin))
                buffers.append(dst)
                pinned.append(pin)
                out[i] = TensorLeaf(leaf.index, leaf.key, leaf.name, dst)
                continue
            gid = group[0]
            if gid not in storage_copy:
                src = t.untyped_storage()
                raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(src)
                dst = alloc(raw.shape, torch.uint8, pin)
                copies.append((dst, raw, pin))
                buffers.append(dst)
                pinned.append(pin)
                storage_copy[gid] = dst
            base = storage_copy[gid]
            # base may be a slice of a larger staging segment: offsets count from its start
            offset = base.storage_offset() // t.element_size() + t.storage_offset()
            view = torch.empty(0, dtype=t.dtype).set_(base.untyped_storage(), offset, t.shape, t.stride())
            out[i] = TensorLeaf(leaf.index, leaf.key, leaf.name, view)
    _copy_all(copies)
    event = None
    if cuda_used and torch.cuda.is_available():
        event = torch.cuda.Event()
        event.record()
    return out, buffers, pinned, event


def _encoder_process() -> encoder_process.EncoderProcess:
    global _encoder
    with _lock:
        if _encoder is None or not _encoder.alive:
            _encoder = encoder_process.EncoderProcess()
            atexit.register(_encoder.close)
        return _encoder


def close_in_encoder(core: Any) -> None:
    """Drop the encoder process's handle on ``core``'s repository (``Repo.close``)."""
    release_lent(core)
    if _encoder is not None:
        # after any save to it already sent: the child serves one message at a time, in order
        _encoder.close_repo(core.location)


def uses_process(repo: "Repo", leaves: list, background: str | None = None) -> bool:
    """Whether a background save of ``leaves`` to ``repo`` runs in the encoder process: when asked
    (``background``, else ``BACKGROUND``), on a local repository, for a state held in CPU memory
    (CUDA tensors stay on the thread path, which copies them into pinned memory without blocking)."""
    from ..store.local import LocalStore
    return ((background or BACKGROUND) == "process" and encoder_process.supported() and isinstance(repo.core.store, LocalStore)
            and all(leaf.tensor.device.type == "cpu" for leaf in leaves))


class _Staged:
    """One save's staging memory.  After its save commits it stays lent to the repository's delta
    cache (the next save's delta bases view it, so the saver copies nothing) until the next save to
    that repository commits; then its memos are dropped and the memory goes back to the pool."""

    def __init__(self, core: Any, buffers: list[torch.Tensor], pinned: list[bool],
                 segment: encoder_process.SharedSegment | None) -> None:
        self.core, self.buffers, self.pinned, self.segment = core, buffers, pinned, segment
        self.owner = ("segment", segment.id) if segment is not None else ("staging", id(self))

    def release(self) -> None:
        if self.segment is not None:
            if _encoder is not None:
                _encoder.drop_owner(self.owner)   # the child reads it before any later save
            _give_back_segment(self.segment)
        else:
            self.core.delta_cache.drop_owner(self.owner)
            _give_back(self.buffers, self.pinned)
        self.buffers = []


_lent: dict[int, _Staged] = {}   # id(Repository) -> staging of its last committed background save


def _settle(staged: _Staged, ok: bool) -> None:
    """After a background save: on success its staging replaces the repository's lent one; on
    failure it is dropped (some memos may already view it)."""
    if not ok or staged.core.delta_cache.max_bytes == 0:   # (no cache: nothing would view it)
        staged.release()
        return
    with _lock:
        previous = _lent.pop(id(staged.core), None)
        _lent[id(staged.core)] = staged
    if previous is not None:
        previous.release()


def release_lent(core: Any) -> None:
    """Give back the staging memory lent to ``core``'s delta cache (``Repo.close``)."""
    with _lock:
        staged = _lent.pop(id(core), None)
    if staged is not None:
        staged.release()


def submit(repo: "Repo", leaves: list, tree: Any, write: Callable[..., Version],
           after: Callable[[Version], None] | None = None, background: str | None = None) -> SaveHandle:
    """Snapshot ``leaves`` now and run ``write(staged_leaves, tree, encoder=..., segment=...,
    owner=...)`` (then ``after(version)``) in the background; ``encoder`` and ``segment`` are None
    on the thread path, ``owner`` marks the staging memory lent to the delta cache.  Used by
    :func:`deltackpt.save` with ``blocking=False``."""
    core = repo.core
    drain(core, keep=MAX_IN_FLIGHT - 1)
    t0 = time.perf_counter()
    segment = None
    if uses_process(repo, leaves, background):
        shared = _sharing(leaves)
        segment, alloc = _segment_allocator(leaves, shared)
        staged, buffers, pinned, event = snapshot(leaves, alloc, shared)
    else:
        staged, buffers, pinned, event = snapshot(leaves)
    stall = time.perf_counter() - t0
    nbytes = sum(b.numel() * b.element_size() for b in buffers)
    timing: dict[str, float] = {}
    staging = _Staged(core, buffers, pinned, segment)

    def work() -> Version:
        start = time.perf_counter()
        ok = False
        try:
            if event is not None:
                event.synchronize()
            encoder = _encoder_process() if segment is not None else None
            version = write(staged, tree, encoder=encoder, segment=segment, owner=staging.owner)
            ok = True
            if after is not None:
                after(version)
            return version
        finally:
            staged.clear()
            _settle(staging, ok)
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
