"""The handle of a background save (:class:`SaveHandle`), and what waiting for one does to the
save's priority (:func:`boost_unless_done`).

Example::

    h = deltackpt.save(state, "ckpt", step=step, blocking=False)
    version = h.wait()
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .. import priority
from ..repo.versions import Version

if TYPE_CHECKING:
    from . import lazy


class SaveHandle:
    """A save running in the background.

    Example::

        h = deltackpt.save(state, "ckpt", step=step, blocking=False)
        ...                      # keep training: the state may change now
        version = h.wait()       # the committed Version, or the save's exception
    """

    def __init__(self, future: "Future[Version]", staged_bytes: int, stall_seconds: float,
                 timing: dict[str, float], deferred: "lazy.LazyCopy | None" = None,
                 waited: threading.Event | None = None) -> None:
        self._future = future
        # set by whoever waits for it: the save must not (or no longer) run idle
        self._waited = waited if waited is not None else threading.Event()
        self._deferred = deferred
        self._observed = False
        self._timing = timing
        self.staged_bytes = staged_bytes
        """Bytes of host memory this save's staging copy takes (back in the handle's pool, for the
        next snapshot, once the save is done)."""
        self.stall_seconds = stall_seconds
        """Seconds the caller was blocked (snapshot of the tensors)."""
        self._runtime: Any = None   # the save runtime that runs it (set when it is queued)

    @property
    def background_seconds(self) -> float | None:
        """Seconds of background work (hash, encode, write, commit), once done."""
        return self._timing.get("background")

    @property
    def lazy_bytes(self) -> int:
        """Bytes of the snapshot copied after the call returned (``optimizer=``; 0 otherwise)."""
        return self._deferred.nbytes if self._deferred is not None else 0

    @property
    def step_wait_seconds(self) -> float:
        """Seconds ``optimizer.step()`` waited for this save's lazy copy (0 when it was done
        first): with ``optimizer=``, the loop's stall is ``stall_seconds`` plus this."""
        return self._deferred.step_wait_seconds if self._deferred is not None else 0.0

    def snapshot_done(self) -> bool:
        """True once the snapshot is complete: the saved tensors may then change in any way."""
        return self._deferred is None or self._deferred.done()

    def wait_snapshot(self) -> None:
        """Block until the lazy part of the snapshot (``optimizer=``) is copied, then unhook the
        optimizers.  Call it before changing a parameter or optimizer-state tensor outside
        ``optimizer.step()`` (``model.load_state_dict``, an EMA update into the live weights,
        ``p.mul_()`` under ``no_grad``).  Call it from the training thread (it unregisters hooks
        the optimizer iterates in ``step()``).  Raises the copy's error, if any."""
        if self._deferred is not None:
            self._deferred.wait()
            self._deferred.remove_hooks()

    def done(self) -> bool:
        """True when the save has committed or failed."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Version:
        """Block until the version is committed and return it; re-raise the save's exception.
        Once it returns, nothing of this save is running (its thread, if idle, has ended)."""
        self._observed = True
        boost_unless_done([self])
        try:
            return self._future.result(timeout)
        finally:
            runtime = self._runtime
            if self._future.done() and runtime is not None:
                runtime.collect(self)
                runtime.join_idle(self._future)

    def exception(self) -> BaseException | None:
        return self._future.exception() if self._future.done() else None

    def __repr__(self) -> str:
        return f"SaveHandle(done={self.done()}, staged_bytes={self.staged_bytes})"


def boost_unless_done(handles: list[SaveHandle]) -> None:
    """The caller is about to wait for ``handles``: saves still running must no longer yield to
    anything (:func:`.priority.boost`); one whose thread has not started yet stays at normal
    priority (:func:`deltackpt.snapshot.async_save._go_idle`)."""
    for h in handles:
        h._waited.set()
    if any(not h.done() for h in handles):
        priority.boost()
