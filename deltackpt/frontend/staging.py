"""Where a background save's snapshot goes, and how long that memory lives.

:func:`stage` copies each tensor into host memory: reusable per-shape buffers (pinned for CUDA
tensors), or one shared segment (:class:`~deltackpt.repo.encoder_process.SharedSegment`) for the
encoder process.  Tensors sharing a storage are copied as one storage and rebuilt as views of it.

After its save commits, a :class:`Staged` copy stays *lent* to the repository's delta cache: the
next save computes its deltas against it, so the saver copies nothing.  When that next save
commits, the cache forgets the memos viewing the older copy, and the memory goes back to the pool.
So a loop saving in the background holds ``keep + 1`` copies of its state, where ``keep`` is the
number of saves in flight (``async_save.MAX_IN_FLIGHT``).
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from ..repo.encoder_process import EncoderProcess, SharedSegment
from . import priority

ALIGN = 64  # staged tensors start on cache-line boundaries (and on any element size)

PARALLEL_COPY_BYTES = 16 << 20
"""A snapshot at least this large is copied by two threads when the machine has a core the training
loop's torch threads leave free.  Memory-bound, but measured 20-30% faster on the 2-vCPU project
machine (271 MB: 43 ms -> 31-38 ms), and the stall is the one part of a background save the loop
waits for.  The other core is idle then: the previous save has finished."""

_lock = threading.Lock()
_staging: dict[tuple, list[torch.Tensor]] = {}   # (shape, dtype, pinned) -> free buffers
_staging_bytes = 0
_segments: list[SharedSegment] = []              # free staging segments (encoder process)
_copier: ThreadPoolExecutor | None = None
_lent: dict[int, "Staged"] = {}                  # id(Repository) -> staging of its last committed save

Alloc = Callable[[torch.Size, torch.dtype, bool], torch.Tensor]


class Staged:
    """One save's staging memory: per-shape ``buffers`` or a shared ``segment``.  ``owner`` is the
    token its lent bytes carry in the delta cache (``BlobInput.owner``)."""

    def __init__(self, core: Any, buffers: list[torch.Tensor], pinned: list[bool], segment: SharedSegment | None) -> None:
        self.core, self.buffers, self.pinned, self.segment = core, buffers, pinned, segment
        self.owner = ("segment", segment.id) if segment is not None else ("staging", id(self))
        self.nbytes = sum(b.numel() * b.element_size() for b in buffers)

    def release(self, encoder: EncoderProcess | None, keep: int) -> None:
        """Make the delta cache forget this memory, then pool it (at most ``keep`` states' worth)."""
        if self.segment is not None:
            if encoder is not None:
                encoder.drop_owner(self.owner)   # the child reads it before any later save
            _give_back_segment(self.segment, encoder, keep)
        else:
            self.core.delta_cache.drop_owner(self.owner)
            _give_back(self.buffers, self.pinned, keep)
        self.buffers = []


def stage(core: Any, leaves: list, shared_memory: bool) -> tuple[list, Staged, Any]:
    """Snapshot ``leaves`` for a background save to ``core``: (staged leaves, their memory, CUDA
    event to wait on or None).  ``shared_memory``: into a segment the encoder process can map."""
    shared = _sharing(leaves)
    segment, alloc = _segment_allocator(leaves, shared) if shared_memory else (None, None)
    staged, buffers, pinned, event = snapshot(leaves, alloc, shared)
    return staged, Staged(core, buffers, pinned, segment), event


def settle(staged: Staged, ok: bool, encoder: EncoderProcess | None, keep: int) -> None:
    """After a background save: on success its staging replaces the repository's lent one; on
    failure it is dropped (some memos may already view it)."""
    if not ok or staged.core.delta_cache.max_bytes == 0:   # (no cache: nothing would view it)
        staged.release(encoder, keep)
        return
    with _lock:
        previous = _lent.pop(id(staged.core), None)
        _lent[id(staged.core)] = staged
    if previous is not None:
        previous.release(encoder, keep)


def release_lent(core: Any, encoder: EncoderProcess | None, keep: int) -> None:
    """Give back the staging memory lent to ``core``'s delta cache (``Repo.close``)."""
    with _lock:
        staged = _lent.pop(id(core), None)
    if staged is not None:
        staged.release(encoder, keep)


# per-shape buffers ------------------------------------------------------------------------------

def _take(shape: torch.Size, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    global _staging_bytes
    with _lock:
        free = _staging.get((tuple(shape), dtype, pinned))
        if free:
            t = free.pop()
            _staging_bytes -= t.numel() * t.element_size()
            return t
    return torch.empty(shape, dtype=dtype, pin_memory=pinned)


def _give_back(buffers: list[torch.Tensor], pinned: list[bool], keep: int) -> None:
    global _staging_bytes
    nbytes = sum(t.numel() * t.element_size() for t in buffers)
    with _lock:
        if _staging_bytes + nbytes > keep * nbytes:
            # buffers of older shapes nobody reused: keep at most ``keep`` states' worth
            _staging.clear()
            _staging_bytes = 0
        for t, p in zip(buffers, pinned):
            _staging.setdefault((tuple(t.shape), t.dtype, p), []).append(t)
        _staging_bytes += nbytes


# shared segments --------------------------------------------------------------------------------

def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _segment_allocator(leaves: list, shared: dict[int, list[int]]) -> tuple[SharedSegment, Alloc]:
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
        seg = SharedSegment(total)
        seg.tensor = torch.frombuffer(seg.map, dtype=torch.uint8)
    pos = 0

    def alloc(shape: torch.Size, dtype: torch.dtype, pin: bool) -> torch.Tensor:
        nonlocal pos
        out = torch.empty(0, dtype=dtype).set_(seg.tensor.untyped_storage(), pos // dtype.itemsize, shape)
        pos += _aligned(math.prod(shape) * dtype.itemsize)
        return out

    return seg, alloc


def _give_back_segment(seg: SharedSegment, encoder: EncoderProcess | None, keep: int) -> None:
    with _lock:
        _segments.append(seg)
        # keep the ``keep`` largest (the state grew: older ones are too small)
        _segments.sort(key=lambda s: s.size, reverse=True)
        extra = _segments[keep:]
        del _segments[keep:]
    for s in extra:
        if encoder is not None:
            encoder.forget(s)
        s.close()


# the copy ---------------------------------------------------------------------------------------

def _sharing(leaves: list) -> dict[int, list[int]]:
    """Leaf index -> the leaves sharing its storage (only for storages shared by several)."""
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        t = leaf.tensor
        if t.untyped_storage().nbytes():
            groups.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(i)
    return {i: g for g in groups.values() if len(g) > 1 for i in g}


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
        # the snapshot is the caller's stall: never at idle priority (see materialize.pool)
        _copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltackpt-snapshot",
                                     initializer=priority.run_idle, initargs=(False,))
    other = _copier.submit(_copy_list, host[cut:])
    _copy_list(host[:cut])
    other.result()


def snapshot(leaves: list, alloc: Alloc | None = None,
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
