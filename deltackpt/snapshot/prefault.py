"""Staging memory ahead of the save: allocated and faulted in before a save needs it.

A background save's stall is its snapshot copy.  Into fresh memory that copy also pays a page
fault (and the kernel's zeroing) per 4 KiB page, which made the first background save of a process
two to three times as slow as later ones (issue 18: 132 ms against 47-65 ms for 268 MB).  So as soon
as the size of a state is known, :func:`prepare` allocates the staging copies a loop saving it in
the background holds (``max_in_flight``), writes every page in a thread the handle's save runtime owns, and pools them
(:meth:`.staging.StagingPool.pool`), where the saves look first.  It runs from
``Checkpointer.prepare(state)``, and by itself when a save allocated staging memory (a state of a
new layout): then for the copies that save did not take.

Bounds: the pool holds what the saves would have allocated anyway; a layout that changes from save
to save at worst has its pre-faulted copies dropped when a save gives its staging back
(:meth:`.staging.StagingPool.give_back` keeps at most ``max_in_flight`` states' worth), and all of
it goes when the handle closes.
"""

from __future__ import annotations

import torch

from .. import priority, threads
from . import staging
from .pinned_slabs import allocate

PREFAULT_IDLE = False
"""Fault staging memory in under SCHED_IDLE (:mod:`.priority`).  Off: measured (bench/first_save.py,
268 MB, 2 cores, 03:45 UTC run) the idle pre-fault thread, started by the first save, held the GIL
while torch's normal-priority threads kept both cores, and the caller's stall waited for it: first
save 120-378 ms at idle against 56-58 ms at normal priority (torch.save+fsync: ~200 ms)."""


def _fault_in(t: torch.Tensor) -> torch.Tensor:
    # write every page now, so a save's copy finds them mapped (no zeroing fault per 4 KiB)
    torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).fill_(0)
    return t


def layout_key(leaves: list, shared_memory: bool) -> tuple:
    """What identifies the staging a state of ``leaves`` takes (one pre-fault per key)."""
    shared = staging.sharing(leaves)
    if shared_memory:
        return ("segment", staging.segment_size(leaves, shared))
    return ("buffers", tuple((s, str(d), p) for s, d, p in staging.buffer_layout(leaves, shared)))


def fault_in(pool: staging.StagingPool, leaves: list, shared_memory: bool, sets: int) -> None:
    """Allocate ``sets`` staging copies for ``leaves``, write every page and pool them in ``pool``,
    where the saves that follow take them instead of fresh memory.  Runs in a thread the save
    runtime starts (and joins when its handle closes)."""
    threads.leave_signals_to_main()
    priority.run_idle(PREFAULT_IDLE)
    shared = staging.sharing(leaves)
    if shared_memory:
        size = staging.segment_size(leaves, shared)
        for _ in range(sets):
            seg = staging.new_segment(size)
            _fault_in(seg.tensor)
            pool.pool([], [], seg)
        return
    layout = staging.buffer_layout(leaves, shared)
    plain = [(s, d) for s, d, p in layout if not p]
    pinned = [(s, d) for s, d, p in layout if p]
    for _ in range(sets):
        slabs = allocate(pinned, pin_memory=pool.pin_memory) if pinned else None
        # page-locked memory is resident once allocated: only pageable slabs (pinning failed) fault
        for slab in slabs.slabs if slabs is not None and not slabs.pinned else []:
            _fault_in(slab)
        pool.pool([_fault_in(torch.empty(s, dtype=d)) for s, d in plain], plain, slabs=slabs)
