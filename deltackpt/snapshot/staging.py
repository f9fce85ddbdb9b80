"""Where a background save's snapshot goes, and how long that memory lives.

:func:`stage` copies each tensor into host memory: reusable per-shape buffers, pinned buffers
carved out of power-of-two slabs for CUDA tensors (:mod:`.pinned_slabs`), or one shared segment
(:class:`~deltackpt.repo.write.encoder_process.SharedSegment`) for the encoder process.  Tensors
sharing a storage are copied as one storage and rebuilt as views of it.

The memory belongs to one repository handle's :class:`StagingPool` (held by its save runtime,
freed when the handle closes).  When its save is done, a :class:`Staged` copy goes back to the pool
(the delta cache copies out the few chunks it keeps), where the next snapshot finds its pages
already faulted in.  So a loop saving in the background holds ``keep`` copies of its state, where
``keep`` is the number of saves in flight (``BackgroundOptions.max_in_flight``).  :mod:`.prefault`
allocates and faults in exactly those copies ahead of the first saves of a state.

The copy itself is :mod:`.host_copy`'s.  A save with ``optimizer=`` (:mod:`.lazy`) hands back the
copies of the optimizer's tensors instead of making them.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import torch

from ..repo.write.encoder_process import EncoderProcess, SharedSegment
from .host_copy import copy_and_fence
from .pinned_slabs import PinnedSlabs, aligned, allocate

Alloc = Callable[[torch.Size, torch.dtype, bool], torch.Tensor]
Layout = list[tuple[tuple[int, ...], torch.dtype, bool]]


class StagingPool:
    """The staging memory of one repository handle's background saves: free per-shape buffers,
    pinned slab sets and shared segments kept for the next saves (at most ``keep`` states'
    worth), and a count of what was allocated while a save waited.

    Example::

        pool = StagingPool(keep=1)
        staged, memory, event, deferred = stage(pool, session, leaves, shared_memory=False)
        pool.release_all(None)      # the handle closes: every buffer goes
    """

    def __init__(self, keep: int, pin_memory: bool = True) -> None:
        self.keep = keep
        self.pin_memory = pin_memory
        """Whether to pin the slabs of CUDA tensors' staging (:func:`.pinned_slabs.allocate`); False
        carves plain memory the same way (what the tests check on a machine without CUDA)."""
        self._lock = threading.Lock()
        self._buffers: dict[tuple, list[torch.Tensor]] = {}   # (shape, dtype) -> free buffers
        self._buffer_bytes = 0
        self._slabs: list[PinnedSlabs] = []                   # free pinned staging, newest first
        self._segments: list[SharedSegment] = []              # free staging segments (encoder process)
        self.fresh_bytes = 0
        """Staging bytes ever allocated while a save waited (not by :mod:`.prefault`): tests pin it."""
        self.last_ids: frozenset[int] = frozenset()
        """Which buffers (``id``) or segment (its ``id``) the last finished save staged into."""

    @property
    def free_bytes(self) -> int:
        """Bytes of free buffers, slabs and segments kept for the next saves."""
        with self._lock:
            return (self._buffer_bytes + sum(s.size for s in self._segments)
                    + sum(s.nbytes for s in self._slabs))

    def take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A free plain buffer of ``shape`` and ``dtype``, or a new one."""
        with self._lock:
            free = self._buffers.get((tuple(shape), dtype))
            if free:
                t = free.pop()
                self._buffer_bytes -= t.numel() * t.element_size()
                return t
        t = torch.empty(shape, dtype=dtype)
        with self._lock:
            self.fresh_bytes += t.numel() * t.element_size()
        return t

    def give_back(self, buffers: list[torch.Tensor]) -> None:
        nbytes = sum(t.numel() * t.element_size() for t in buffers)
        with self._lock:
            if self._buffer_bytes + nbytes > self.keep * nbytes:
                # buffers of older shapes nobody reused: keep at most ``keep`` states' worth
                self._buffers.clear()
                self._buffer_bytes = 0
            for t in buffers:
                self._buffers.setdefault((tuple(t.shape), t.dtype), []).append(t)
            self._buffer_bytes += nbytes

    def take_slabs(self, layout: list[tuple[tuple[int, ...], torch.dtype]]) -> PinnedSlabs:
        """Free pinned staging for the pinned buffers of ``layout`` (shape, dtype each), or new."""
        key = tuple((tuple(shape), dtype) for shape, dtype in layout)
        with self._lock:
            found = next((s for s in self._slabs if s.layout == key), None)
            if found is not None:
                self._slabs.remove(found)
                return found
        slabs = allocate(key, pin_memory=self.pin_memory)
        with self._lock:
            self.fresh_bytes += slabs.nbytes
        return slabs

    def give_back_slabs(self, slabs: PinnedSlabs) -> None:
        with self._lock:
            # the newest ``keep`` sets (a layout that changed leaves its older sets behind)
            self._slabs.insert(0, slabs)
            del self._slabs[self.keep:]

    def pool(self, buffers: list[torch.Tensor], layout: list, segment: SharedSegment | None = None,
             slabs: PinnedSlabs | None = None) -> None:
        """Put memory faulted in ahead of a save (:mod:`.prefault`) where the next saves look first:
        plain ``buffers`` of ``layout`` (shape, dtype each), a ``segment`` or pinned ``slabs``."""
        with self._lock:
            if segment is not None:
                self._segments.append(segment)
                self._segments.sort(key=lambda s: s.size, reverse=True)
            if slabs is not None:
                self._slabs.append(slabs)
            for t, (shape, dtype) in zip(buffers, layout):
                self._buffers.setdefault((shape, dtype), []).append(t)
                self._buffer_bytes += t.numel() * t.element_size()

    def take_segment(self, total: int) -> SharedSegment:
        """A free staging segment of at least ``total`` bytes, or a new one."""
        with self._lock:
            fits = [s for s in self._segments if s.size >= total]
            seg = min(fits, key=lambda s: s.size) if fits else None
            if seg is not None:
                self._segments.remove(seg)
        if seg is None:
            seg = new_segment(total)
            with self._lock:
                self.fresh_bytes += seg.size
        return seg

    def give_back_segment(self, seg: SharedSegment, encoder: EncoderProcess | None) -> None:
        with self._lock:
            self._segments.append(seg)
            # keep the ``keep`` largest (the state grew: older ones are too small)
            self._segments.sort(key=lambda s: s.size, reverse=True)
            extra = self._segments[self.keep:]
            del self._segments[self.keep:]
        for s in extra:
            if encoder is not None:
                encoder.forget(s)
            s.close()

    def release(self, staged: "Staged", encoder: EncoderProcess | None) -> None:
        """A background save is done (committed or failed): its staging goes back to the pool."""
        self.last_ids = frozenset([staged.segment.id]) if staged.segment is not None else \
            frozenset([id(t) for t in staged.buffers] + ([id(staged.slabs)] if staged.slabs is not None else []))
        staged.release(self, encoder)

    def release_all(self, encoder: EncoderProcess | None) -> None:
        """Free every pooled buffer and segment (the handle closes)."""
        with self._lock:
            segments, self._segments = self._segments, []
            self._buffers.clear()
            self._slabs.clear()
            self._buffer_bytes = 0
        for s in segments:
            if encoder is not None:
                encoder.forget(s)
            s.close()


class Staged:
    """One save's staging memory: a shared ``segment``, or per-shape plain ``buffers`` and the
    pinned ``slabs`` of its CUDA tensors.  ``nbytes``: the state's bytes staged."""

    def __init__(self, nbytes: int, buffers: list[torch.Tensor], segment: SharedSegment | None,
                 slabs: PinnedSlabs | None) -> None:
        self.nbytes, self.buffers, self.segment, self.slabs = nbytes, buffers, segment, slabs

    def release(self, pool: StagingPool, encoder: EncoderProcess | None) -> None:
        """Pool this memory for the next snapshot (once: a second call does nothing)."""
        if self.segment is not None:
            segment, self.segment = self.segment, None
            pool.give_back_segment(segment, encoder)
        if self.buffers:
            pool.give_back(self.buffers)
        if self.slabs is not None:
            slabs, self.slabs = self.slabs, None
            pool.give_back_slabs(slabs)
        self.buffers = []


def stage(pool: StagingPool, leaves: list, shared_memory: bool,
          lazy_keys: set | None = None) -> tuple[list, Staged, Any, tuple[list, list]]:
    """Snapshot ``leaves`` for a background save: (staged leaves, their memory,
    CUDA event to wait on or None, deferred copies).  ``shared_memory``: into a segment the encoder
    process can map.  Tensors whose storage is in ``lazy_keys`` (:func:`.lazy.owned_storages`)
    are not copied now: their (staging, source) pairs come back as deferred ``(host, cuda)``
    copies for :class:`.lazy.LazyCopy`.  ``pool.fresh_bytes`` grows when this allocated staging
    memory (a state of a new layout)."""
    shared = sharing(leaves)
    segment: SharedSegment | None = None
    slabs: PinnedSlabs | None = None
    if shared_memory:
        segment, alloc = _segment_allocator(pool, leaves, shared)
    else:
        slabs, alloc = _buffer_allocator(pool, leaves, shared)
    out, buffers, pinned, copies = _plan(leaves, alloc, shared)
    deferred: tuple[list, list] = ([], [])
    if lazy_keys:
        from .lazy import storage_key
        now = []
        for dst, src, pin in copies:
            if storage_key(src) in lazy_keys:
                deferred[1 if pin else 0].append((dst, src))
            else:
                now.append((dst, src, pin))
        copies = now
    event = copy_and_fence(copies)
    nbytes = sum(b.numel() * b.element_size() for b in buffers)
    plain = [] if segment is not None else [b for b, p in zip(buffers, pinned) if not p]
    return out, Staged(nbytes, plain, segment, slabs), event, deferred


# per-shape buffers and pinned slabs -----------------------------------------------------------

def _pinned(t: torch.Tensor) -> bool:
    """Whether ``t`` stages into pinned memory (a CUDA tensor, CUDA usable)."""
    return t.device.type == "cuda" and torch.cuda.is_available()


def buffer_layout(leaves: list, shared: dict[int, list[int]]) -> Layout:
    """The staging buffers :func:`_plan` takes for ``leaves``, in its order: (shape, dtype,
    pinned) each."""
    out: Layout = []
    for i, leaf in enumerate(leaves):
        t, group = leaf.tensor, shared.get(i)
        pin = _pinned(t)
        if group is None:
            out.append((tuple(t.shape), t.dtype, pin))
        elif group[0] == i:
            out.append(((t.untyped_storage().nbytes(),), torch.uint8, pin))
    return out


def _buffer_allocator(pool: StagingPool, leaves: list, shared: dict[int, list[int]]) -> tuple[PinnedSlabs | None, Alloc]:
    """Pinned staging for the CUDA tensors of ``leaves`` (None when there are none) and an
    allocator that hands out its buffers in :func:`_plan`'s order, and per-shape plain buffers
    from the pool for the others."""
    pinned = [(shape, dtype) for shape, dtype, pin in buffer_layout(leaves, shared) if pin]
    slabs = pool.take_slabs(pinned) if pinned else None
    views = iter(slabs.buffers if slabs is not None else [])

    def alloc(shape: torch.Size, dtype: torch.dtype, pin: bool) -> torch.Tensor:
        if not pin:
            return pool.take(shape, dtype)
        buf = next(views)
        if buf.shape != shape or buf.dtype != dtype:   # buffer_layout and _plan out of step: a bug
            raise RuntimeError(f"pinned staging for {tuple(buf.shape)} {buf.dtype}, not {tuple(shape)} {dtype}")
        return buf

    return slabs, alloc


# shared segments --------------------------------------------------------------------------------

def _segment_allocator(pool: StagingPool, leaves: list, shared: dict[int, list[int]]) -> tuple[SharedSegment, Alloc]:
    """A staging segment big enough for ``leaves`` (reused from an earlier save when one is free)
    and an allocator that carves it, in snapshot order, into contiguous tensors."""
    seg = pool.take_segment(segment_size(leaves, shared))
    pos = 0

    def alloc(shape: torch.Size, dtype: torch.dtype, pin: bool) -> torch.Tensor:
        nonlocal pos
        # torch's stub wants a stride too; the runtime defaults it to contiguous, which this is
        out = torch.empty(0, dtype=dtype).set_(seg.tensor.untyped_storage(), pos // dtype.itemsize,  # type: ignore[call-overload]
                                               shape)
        pos += aligned(math.prod(shape) * dtype.itemsize)
        return out

    return seg, alloc


def new_segment(size: int) -> SharedSegment:
    seg = SharedSegment(size)
    seg.tensor = torch.frombuffer(seg.map, dtype=torch.uint8)
    return seg


def segment_size(leaves: list, shared: dict[int, list[int]]) -> int:
    total = 0
    for i, leaf in enumerate(leaves):
        group = shared.get(i)
        if group is None:
            total += aligned(leaf.tensor.numel() * leaf.tensor.element_size())
        elif group[0] == i:
            total += aligned(leaf.tensor.untyped_storage().nbytes())
    return total


# the plan ---------------------------------------------------------------------------------------

def sharing(leaves: list) -> dict[int, list[int]]:
    """Leaf index -> the leaves sharing its storage (only for storages shared by several)."""
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        t = leaf.tensor
        if t.untyped_storage().nbytes():
            groups.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(i)
    return {i: g for g in groups.values() if len(g) > 1 for i in g}


def _plan(leaves: list, alloc: Alloc, shared: dict[int, list[int]]) -> tuple[list, list[torch.Tensor], list[bool], list]:
    """Staging for each leaf: (new leaves viewing it, staging buffers, pinned flags, the copies
    to make as (staging, source, pinned)).  Tensors sharing a storage get one copy of the storage
    and are rebuilt as views of it, so sharing survives."""
    from ..torchstate.flatten import TensorLeaf

    out: list = [None] * len(leaves)
    buffers: list[torch.Tensor] = []
    pinned: list[bool] = []
    storage_copy: dict[int, torch.Tensor] = {}
    copies: list[tuple[torch.Tensor, torch.Tensor, bool]] = []
    for i, leaf in enumerate(leaves):
        t = leaf.tensor
        pin = _pinned(t)
        group = shared.get(i)
        if group is None:
            dst = alloc(t.shape, t.dtype, pin)
            copies.append((dst, t.detach(), pin))
            buffers.append(dst)
            pinned.append(pin)
            out[i] = TensorLeaf(leaf.index, leaf.key, leaf.name, dst)
            continue
        gid = group[0]
        if gid not in storage_copy:
            raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
            dst = alloc(raw.shape, torch.uint8, pin)
            copies.append((dst, raw, pin))
            buffers.append(dst)
            pinned.append(pin)
            storage_copy[gid] = dst
        base = storage_copy[gid]
        # base may be a slice of a larger staging segment: offsets count from its start
        offset = base.storage_offset() // t.element_size() + t.storage_offset()
        out[i] = TensorLeaf(leaf.index, leaf.key, leaf.name,
                            torch.empty(0, dtype=t.dtype).set_(base.untyped_storage(), offset, t.shape, t.stride()))
    return out, buffers, pinned, copies
