"""Staging memory ahead of the save: allocated and faulted in before a save needs it.

A background save's stall is its snapshot copy.  Into fresh memory that copy also pays a page
fault (and the kernel's zeroing) per 4 KiB page, which made the first background save of a process
two to three times as slow as later ones (issue 18: 132 ms against 47-65 ms for 268 MB).  So as soon
as the size of a state is known, :func:`prepare` allocates the staging copies a loop saving it in
the background holds (:func:`sets_for`: ``MAX_IN_FLIGHT``, plus the one lent to the delta cache),
writes every page in a background thread, and pools them (:func:`.staging.pool`), where the saves
look first.  It runs from ``Checkpointer.prepare(state)``, and by itself when a save allocated
staging memory (a state of a new layout): then for the copies that save did not take.

Bounds: the pool holds what the saves would have allocated anyway; a layout that changes from save
to save at worst has its pre-faulted copies dropped when a save gives its staging back
(:func:`.staging._give_back` keeps at most ``MAX_IN_FLIGHT`` states' worth).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from .. import priority, threads
from . import staging

PREFAULT_IDLE = False
"""Fault staging memory in under SCHED_IDLE (:mod:`.priority`).  Off: measured (bench/first_save.py,
268 MB, 2 cores, 03:45 UTC run) the idle pre-fault thread, started by the first save, held the GIL
while torch's normal-priority threads kept both cores, and the caller's stall waited for it: first
save 120-378 ms at idle against 56-58 ms at normal priority (torch.save+fsync: ~200 ms)."""

AFTER_FIRST_SAVE = True
"""Fault in the next staging copy right after the first background save of a layout.  It is the
copy the second save would allocate; a process that saves a state only once holds it for nothing
(until ``Repo.close`` drops it to ``MAX_IN_FLIGHT`` copies): set False there."""

_prefaulter: ThreadPoolExecutor | None = None
_preparing: dict[tuple, Future] = {}             # layout of a state -> its background pre-fault


def sets_for(core: Any, keep: int) -> int:
    """Staging copies a loop saving in the background holds: ``keep`` in flight, plus the one lent
    to the delta cache when the repository has one."""
    return keep + (1 if core.delta_cache.max_bytes else 0)


def _layout(leaves: list, shared: dict[int, list[int]]) -> list[tuple[tuple, torch.dtype, bool]]:
    """The staging buffers :func:`.staging._plan` takes for ``leaves``: (shape, dtype, pinned) each."""
    out = []
    for i, leaf in enumerate(leaves):
        t, group = leaf.tensor, shared.get(i)
        pin = t.device.type == "cuda" and torch.cuda.is_available()
        if group is None:
            out.append((tuple(t.shape), t.dtype, pin))
        elif group[0] == i:
            out.append(((t.untyped_storage().nbytes(),), torch.uint8, pin))
    return out


def _fault_in(t: torch.Tensor) -> torch.Tensor:
    # write every page now, so a save's copy finds them mapped (no zeroing fault per 4 KiB)
    torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).fill_(0)
    return t


def prepare(leaves: list, shared_memory: bool, sets: int) -> Future | None:
    """Allocate and fault in ``sets`` staging copies for ``leaves`` in a background thread (at the
    background saves' priority) and pool them, so the saves that follow take them instead of
    fresh memory.  Once per layout; returns the pre-fault's future (None when nothing to do)."""
    global _prefaulter
    shared = staging._sharing(leaves)
    if shared_memory:
        size = staging._segment_size(leaves, shared)
        key: tuple = ("segment", size)
    else:
        layout = _layout(leaves, shared)
        key = ("buffers", tuple((s, str(d), p) for s, d, p in layout))
    with staging._lock:
        if sets < 1 or key in _preparing:
            return _preparing.get(key)
        if _prefaulter is None:
            _prefaulter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltackpt-prefault")

    def work() -> None:
        threads.leave_signals_to_main()
        priority.run_idle(PREFAULT_IDLE)
        for _ in range(sets):
            if shared_memory:
                seg = staging._new_segment(size)
                _fault_in(seg.tensor)
                staging.pool([], [], seg)
            else:
                staging.pool([_fault_in(torch.empty(s, dtype=d, pin_memory=p)) for s, d, p in layout], layout)

    future = _prefaulter.submit(work)
    with staging._lock:
        if len(_preparing) >= 8:   # layouts that keep changing: remember only recent ones
            _preparing.clear()
        _preparing[key] = future
    return future
