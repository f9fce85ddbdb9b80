"""Pausing the interpreter's cyclic collector while a call builds many short-lived containers.

A load decodes a manifest, an index and a plan into thousands of small objects that all die
when it returns.  With the collector running, those alive at a young collection are promoted and
counted towards the next full collection, which then scans every object the process holds (after
``import torch`` and transformers, ~415,000: ~195 ms on the project machine) only to find them
already gone.  Paused, they die by reference counting and are never counted.  What the call keeps
(the loaded state, new index entries) is counted at the next young collection as usual.
``python -m bench collector_cost`` counts both.  Mercurial pauses its collector the same way
while it parses large manifests.

The pause covers load, restore, resume and save (a background save's thread is not paused),
where the count was measured to fall.  Maintenance (gc, verify) showed no gain in the collector's
time over the call and the program's next allocations, so it runs unpaused.  The collector is process-wide state: the
pause nests and is shared between threads (the last call to leave restores the setting the first
one found), a collector the program turned off stays off, and a child forked during a pause
starts with the collector the parent had before it.  Another thread of the program that runs
during a pause has its cyclic garbage collected when the pause ends: later, never skipped.

Example::

    with collector_paused():
        manifest = decode(raw)
"""

from __future__ import annotations

import gc
import os
import threading
from contextlib import contextmanager
from typing import Iterator


class _Pauses:
    """The pauses in progress (the collector's switch is the interpreter's, shared by every thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_enabled = False

    def enter(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.depth += 1

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.was_enabled:
                gc.enable()


    def forget_in_child(self) -> None:
        """In a child forked while a pause was on (a DataLoader worker started by another thread,
        say): the pause belongs to the parent's call, so the child gets its collector back."""
        self.lock = threading.Lock()
        if self.depth and self.was_enabled:
            gc.enable()
        self.depth = 0


_PAUSES = _Pauses()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_PAUSES.forget_in_child)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off; the last pause to end turns it back on
    if the first one found it on."""
    _PAUSES.enter()
    try:
        yield
    finally:
        _PAUSES.leave()
