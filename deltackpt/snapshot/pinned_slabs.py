"""Pinned staging for a CUDA state, carved out of a few slabs whose sizes are powers of two.

torch's pinned-memory allocator (``pin_memory=True``) rounds every allocation up to a power of two
so that its cache can reuse blocks.  With one pinned buffer per tensor, a background save of
GPT-2 + AdamW kept 1.66x the state resident on an H200 (bench/CUDA.md, stop 39): each 147 MiB
tensor took a 256 MiB block.  Here the pinned buffers of one state are packed into slabs whose
sizes are powers of two already, so the allocator rounds nothing, and each buffer is a tensor of
its own storage over its place in a slab.  A storage of its own matters: the save groups tensors
that share a storage (tied weights) into one blob, and views of one slab would all look tied.

:func:`pack` places the buffers first fit, largest first: a buffer goes into the first slab with
room left, or opens a slab of ``max(SLAB_BYTES, its size rounded up to a power of two)``; then
each slab shrinks to the power of two above what it holds, and a part-filled slab of small
buffers is packed again into smaller slabs when they take less.  So the memory above the state's
own bytes is the room that smaller buffers left unfilled in slabs opened by buffers over
SLAB_BYTES, plus the slack of the last small slabs (measured on real layouts: ``python -m bench
pinned_staging``), and a state never takes more than one power of two per buffer (of at least
ALIGN bytes) did.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

SLAB_BYTES = 64 << 20
"""The size of a slab that buffers up to this size open.  Small enough that the last, partly
filled slab costs little next to a GPU state; large enough that a state of a few hundred
tensors takes tens of slabs, not hundreds of pinned allocations."""

ALIGN = 64
"""Staged buffers start on cache-line boundaries (and so on any element size): here, and in the
encoder process's shared segment (:mod:`.staging`)."""


def aligned(n: int) -> int:
    """``n`` rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


def layout_bytes(layout: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[int]:
    """The bytes of each (shape, dtype) buffer of ``layout``."""
    return [math.prod(shape) * dtype.itemsize for shape, dtype in layout]


def power_of_two_above(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n`` <= 1): the size torch's pinned allocator
    takes for an allocation of ``n`` bytes."""
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class SlabPlan:
    """Where each buffer goes: ``slabs`` (bytes each, powers of two) and ``places`` (slab index,
    byte offset) per buffer, in the order the sizes were given."""

    slabs: tuple[int, ...]
    places: tuple[tuple[int, int], ...]


def pack(sizes: Sequence[int], slab_bytes: int = SLAB_BYTES) -> SlabPlan:
    """Pack buffers of ``sizes`` bytes into power-of-two slabs (see the module's docstring).

    Example::

        >>> pack([100 << 20, 9 << 20, 9 << 20]).slabs == (128 << 20,)
        True
    """
    slabs: list[int] = []
    places: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    for used, members in _first_fit(sizes, slab_bytes):
        size = power_of_two_above(max(used, 1))
        if len(members) > 1 and used < size <= slab_bytes:
            # a slab of small buffers, part filled: the same buffers in smaller slabs may take less
            # (this is what keeps the total at most one power of two per buffer)
            sub = pack([sizes[i] for i, _ in members], size // 2)
            if sum(sub.slabs) < size:
                for (i, _), (s, off) in zip(members, sub.places):
                    places[i] = (len(slabs) + s, off)
                slabs += sub.slabs
                continue
        for i, off in members:
            places[i] = (len(slabs), off)
        slabs.append(size)
    return SlabPlan(tuple(slabs), tuple(places))


def _first_fit(sizes: Sequence[int], slab_bytes: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """First fit, largest first, into slabs of ``max(slab_bytes, the opening buffer rounded up to a
    power of two)``: (bytes used, [(buffer index, offset)]) per slab."""
    room: list[int] = []
    slabs: list[tuple[int, list[tuple[int, int]]]] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        n = aligned(sizes[i])
        slab = next((s for s in range(len(room)) if slabs[s][0] + n <= room[s]), None)
        if slab is None:
            room.append(max(slab_bytes, power_of_two_above(n)))
            slabs.append((0, []))
            slab = len(room) - 1
        used, members = slabs[slab]
        members.append((i, used))
        slabs[slab] = (used + n, members)
    return slabs


def _own_storage(slab: torch.Tensor, offset: int, nbytes: int) -> torch.Tensor:
    # numpy's slice keeps the slab alive (its base) and torch.from_numpy gives the bytes a
    # storage of their own; CUDA still sees the pages as pinned (the pointer lies in a pinned block)
    return torch.from_numpy(slab.numpy()[offset:offset + nbytes])


class PinnedSlabs:
    """The pinned staging of one state layout: its slabs, and a buffer of the given shape and dtype
    for each entry of ``layout``, each with a storage of its own.  ``pin_memory=False`` carves
    plain memory the same way (what the tests on a machine without CUDA check).

    Example::

        slabs = PinnedSlabs([((768, 768), torch.float32), ((768,), torch.float32)])
        w, b = slabs.buffers     # pinned views into one 4 MiB slab
    """

    def __init__(self, layout: Sequence[tuple[tuple[int, ...], torch.dtype]], pin_memory: bool = True) -> None:
        self.layout = tuple((tuple(shape), dtype) for shape, dtype in layout)
        self.pinned = pin_memory
        sizes = layout_bytes(self.layout)
        plan = pack(sizes)
        self.slabs = [torch.empty(n, dtype=torch.uint8, pin_memory=pin_memory) for n in plan.slabs]
        self.buffers = [_own_storage(self.slabs[s], off, n).view(dtype).view(shape)
                        for (s, off), n, (shape, dtype) in zip(plan.places, sizes, self.layout)]

    @property
    def nbytes(self) -> int:
        """Bytes of the slabs (what this staging keeps resident)."""
        return sum(s.numel() for s in self.slabs)

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the buffers (the state's own size)."""
        return sum(b.numel() * b.element_size() for b in self.buffers)


def allocate(layout: Sequence[tuple[tuple[int, ...], torch.dtype]], pin_memory: bool = True) -> PinnedSlabs:
    """Slabs for ``layout``, pinned where they can be.  Where pinning fails (no usable CUDA
    driver, or the host's page-locked memory exhausted: torch raises and clears the CUDA error)
    the same slabs are made of pageable memory, with a warning: the save still happens, and its
    device -> host copies are then synchronous, so a background save stalls the loop longer.

    Example::

        slabs = allocate([((768, 768), torch.float32)])
        slabs.pinned     # False on a machine without CUDA
    """
    if pin_memory:
        try:
            return PinnedSlabs(layout, pin_memory=True)
        except RuntimeError as exc:
            nbytes = sum(layout_bytes(layout))
            warnings.warn(f"deltackpt: could not pin {nbytes / 2**20:.0f} MiB of staging ({str(exc).splitlines()[0]:.200}); "
                          "staging in pageable memory, so the copies from the GPU are synchronous",
                          RuntimeWarning, stacklevel=2)
    return PinnedSlabs(layout, pin_memory=False)
