"""When and how a training loop saves: :class:`Checkpointer` asks its policy at every step,
saves in the background and applies the retention rules after each save.

Example::

    ckpt = Checkpointer("ckpt", policy=[EveryN(200), OnImprovement("val_loss")],
                        retention=Retention(keep_last=3))
    ckpt.step(lambda: training_state(model=model, optimizer=opt, step=step), step=step, metrics={"loss": loss})
    ckpt.close()
"""

from __future__ import annotations

import os
import time
import threading
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

import torch

from ..api import Repo, internal
from ..api.internal import DEFAULT_GRACE_SECONDS, Retention, Version, check_seconds
from ..errors import DeltackptError, InvalidArgumentError
from .policies import Policy, as_policy

if TYPE_CHECKING:
    from ..api.internal import SaveHandle
    from ..api.types import Encoding, Metrics, Optimizers, State, Where
    from .guard import Guard
    from .report import Rollback


class Checkpointer:
    """Decides at every step whether to save, saves (in the background by default) and applies a
    retention policy after each save.

    Args:
        repo: the repository: a path or URL, or a :class:`~deltackpt.Repo`.
        policy: when to save: a :mod:`~deltackpt.training.policies` object, an int (every N steps)
            or a list (save when any is due).
        retention: a :class:`~deltackpt.Retention` run as gc after every ``gc_every`` saves (in the
            background thread, after the save commits).
        blocking: save in the loop's thread (True) or in the background (default).
        gc_every: run ``retention`` after every this many saves.
        encoding: lossy modes by name pattern, as in :func:`deltackpt.save`.
        grace_seconds: gc's grace period, as in :func:`deltackpt.gc`.
        start_step: the step a resumed run starts from (``resume(...).step``), so schedules continue
            instead of restarting.
        clock: the clock time-based policies read (``time.monotonic``).
        background: ``"thread"`` or ``"process"``, as in :func:`deltackpt.save`.
        snapshot: ``"eager"`` (default) copies every tensor before :meth:`step` returns;
            ``"lazy"``, with ``optimizer``, returns before the optimizer's parameters and state are
            copied, and ``opt.step()`` waits for the copy (``optimizer`` in
            :func:`deltackpt.save` says exactly what is safe, ``self.last.wait_snapshot()`` what is
            not).
        optimizer: the optimizer (one or a list) a lazy snapshot watches.
        guard: a :class:`~deltackpt.Guard` judging the ``metrics`` of every step; when it rolls the
            run back, :meth:`step` saves nothing, sets ``rollback`` and the loop carries on from
            ``rollback.step`` with a new data iterator.
        drill_every: a rollback drill of ``drill_revision`` after every that many saves, in the
            background at idle priority; its measured restore time goes to the policy
            (``YoungDaly``).
        drill_revision: the revision drilled.
        writes: False for a rank that judges and rolls back with the others but never saves
            (torch.distributed: ``writes=(rank == 0)``).

    Raises:
        InvalidArgumentError: a setting out of range.

    Under torch.distributed, give every rank a Checkpointer and its own Guard and call
    :meth:`step` at the same steps on all of them, with ``writes=(rank == 0)``: a rank that does
    not write never saves (it judges with its guard and rolls back with the others).

    :meth:`prepare` allocates and faults in the staging memory the background saves of a state
    will hold, in a thread of the repository handle, so the first save costs what the later ones
    do.  The first :meth:`step` given a state (not a callable) calls it; with a callable, call it
    yourself.  Given a path, the Checkpointer opens the repository handle itself and
    :meth:`close` closes it.

    Example:
        ```python
        ckpt = Checkpointer("ckpt", policy=YoungDaly(mtbf=4 * 3600), retention=Retention(keep_last=3))
        for step in range(1, n + 1):
            loss = train_step()
            ckpt.step(lambda: training_state(model=model, optimizer=opt, step=step), step=step,
                      metrics={"loss": loss})
        ckpt.close()     # waits for the last save
        ```
    """

    def __init__(self, repo: "str | os.PathLike[str] | Repo", policy: "Policy | int | Sequence[Policy | int] | None" = None,
                 *, retention: Retention | None = None, blocking: bool = False, gc_every: int = 1,
                 encoding: Encoding | None = None, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                 start_step: int | None = None, clock: Callable[[], float] = time.monotonic,
                 background: Where | None = None, snapshot: Literal["eager", "lazy"] = "eager",
                 optimizer: Optimizers | None = None, guard: "Guard | None" = None, drill_every: int | None = None,
                 drill_revision: str = "latest", writes: bool = True) -> None:

        if retention is not None and not isinstance(retention, Retention):
            raise InvalidArgumentError(f"retention must be a Retention, got {type(retention).__name__}")
        grace_seconds = check_seconds("grace_seconds", grace_seconds, allow_inf=True)  # before any I/O
        from ..torchstate.optimizers import optimizers_of
        if snapshot not in ("eager", "lazy"):
            raise InvalidArgumentError(f"snapshot must be 'eager' or 'lazy', got {snapshot!r}")
        if snapshot == "lazy" and optimizer is None:
            raise InvalidArgumentError("snapshot='lazy' needs optimizer=: its step is what waits for the copy")
        if not isinstance(writes, bool):
            raise InvalidArgumentError(f"writes must be True or False, got {writes!r:.60}")
        self.snapshot, self.writes = snapshot, writes
        self.optimizers = optimizers_of(optimizer) if optimizer is not None else None
        # a path: this Checkpointer opens the handle and closes it in close(); a Repo stays the caller's
        self._owns_repo = not isinstance(repo, Repo)
        self.repo = repo if isinstance(repo, Repo) else Repo(repo, create=True)
        self.background = background
        self.policy = as_policy(policy)
        self.retention = retention
        if retention is not None and retention.keep_last:
            # versions the policy is about to drop never cost a delta write
            internal.set_deltify_lag(self.repo, retention.keep_last)
        self.blocking = blocking
        self.gc_every = max(1, int(gc_every))
        self.encoding = encoding
        self.grace_seconds = grace_seconds
        self.clock = clock
        self.saves = 0
        self.stall_seconds = 0.0
        """Total seconds :meth:`step` blocked the caller for saves (snapshots, waits, blocking saves)."""
        self.last: "SaveHandle | Version | None" = None
        self._prepared = False
        if start_step is not None:  # resumed: step-based schedules continue, not restart at 0
            self.policy.resumed(start_step, self.clock())
            # metric-based ones remember the best so far (versions of an abandoned future excluded)
            self.policy.recall([dict(v.metrics) for v in reversed(self.repo.log())
                                if v.step is not None and v.step <= start_step])
        self._attach(guard, drill_every, drill_revision, start_step)

    def _attach(self, guard: "Guard | None", drill_every: int | None, drill_revision: str,
                start_step: int | None) -> None:
        from .drills import Driller, last_restore_seconds
        from .guard import Guard

        if guard is not None and not isinstance(guard, Guard):
            raise InvalidArgumentError(f"guard must be a deltackpt.training.Guard, got {type(guard).__name__}")
        self.guard = guard
        self.rollback: "Rollback | None" = None
        """What the guard did at the last :meth:`step`, or None (see :class:`~deltackpt.training.Guard`)."""
        if guard is not None:
            guard.attach(self.repo, start_step=start_step)
            if guard.commit is True:   # commit through this Checkpointer's settings
                guard.commit = lambda rb: self._commit(guard.rollback_state(rb), rb.step, guard.rollback_meta(rb))
        self.drills = Driller(self.repo, drill_every, drill_revision) if drill_every is not None else None
        restore = last_restore_seconds(self.repo)
        if restore is not None:
            self.policy.restore_measured(restore)
        self._told_restore = restore

    def due(self, step: int, metrics: Metrics | None = None) -> bool:
        """Whether the policy would save at ``step`` (with these ``metrics``), without saving.

        Args:
            step: the training step.
            metrics: the values reported this step.

        Returns:
            True when a save is due.
        """
        return self.policy.due(step, self.clock(), metrics or {})

    def step(self, state: "Mapping[str, Any] | Callable[[], State] | None" = None, *, step: int, metrics: Metrics | None = None,
             force: bool = False, meta: object = None, tag: str | None = None) -> "SaveHandle | Version | None":
        """Save ``state`` if the policy says so (or ``force``).

        Args:
            state: the state to save, or a callable returning it, called only when a save is due.  The
                first call given a state (not a callable) also calls :meth:`prepare`.
            step: the training step.
            metrics: the values reported this step: the policy and the guard judge them, and a save
                records them.
            force: save whatever the policy says.
            meta: plain values recorded with the save.
            tag: a name for the version saved.

        Returns:
            The save's handle (background) or Version (blocking), or None when nothing was saved.

        Raises:
            DivergenceError: the guard gave up (too many rollbacks).
        """

        from ..api import save

        metrics = dict(metrics or {})
        self._hear_drill()
        if self.guard is not None:
            self.rollback = self.guard.check(step, metrics)
            if self.rollback is not None:   # the live state is a restored version's now: no save of it
                self.policy.resumed(self.rollback.step, self.clock())
                return None
        if not self.writes:
            return None
        if not self._prepared and state is not None and not callable(state):
            self._prepared = True   # the state's size is known now: its staging faults in meanwhile
            try:
                self.prepare(state)
            except DeltackptError:
                pass   # a state that cannot be saved is refused by the save that tries it
        if not (force or self.due(step, metrics)):
            return None
        t0 = time.perf_counter()
        obj = state() if callable(state) else state
        if obj is None:
            raise DeltackptError("Checkpointer.step: a save is due but no state was given")
        lazy = self.optimizers if self.snapshot == "lazy" and not self.blocking else None
        result = save(obj, self.repo, step=step, metrics=metrics, meta=meta, tag=tag, encoding=self.encoding,
                      blocking=self.blocking, background=self.background, optimizer=lazy)
        self.saves += 1
        if self.retention is not None and self.saves % self.gc_every == 0:
            self._collect()
        cost = time.perf_counter() - t0
        self.stall_seconds += cost
        self.policy.saved(step, self.clock(), cost, metrics)
        self.last = result
        if self.guard is not None:
            self.guard.saved(step, result)
        if self.drills is not None:
            if not self.blocking:   # drill what this save commits, not the version before it
                internal.run_after(self.repo, self.drills.saved)
            else:
                self.drills.saved()
        return result

    def _commit(self, state: State, step: int, meta: object = None) -> Version:

        """A blocking save outside the policy (a guard's rollback), with this Checkpointer's settings."""
        from ..api import save

        version = save(state, self.repo, step=step, meta=meta, encoding=self.encoding)
        self.saves += 1
        return version

    def _hear_drill(self) -> None:
        """Give the policy a restore time a background drill measured since the last step."""
        measured = self.drills.measured() if self.drills is not None else None
        if measured is not None and measured != self._told_restore:
            self.policy.restore_measured(measured)
            self._told_restore = measured

    def prepare(self, state: "Mapping[str, Any] | Callable[[], State]") -> "threading.Thread | None":
        """Allocate and fault in, in a background thread, the staging memory background saves of
        ``state`` hold (``BackgroundOptions.max_in_flight`` copies), so the first save costs what
        the later ones do.

        Call it once the state has its final shapes (after the first optimizer step, when the
        optimizer state exists); saves of another layout simply allocate their own.

        Args:
            state: the state (or a callable returning it) the saves will take.

        Returns:
            The pre-fault's thread, which the repository handle owns (None for a blocking
            Checkpointer).
        """
        from ..torchstate.flatten import flatten

        if self.blocking:
            return None   # a blocking save stages nothing
        obj = state() if callable(state) else state
        if isinstance(obj, torch.nn.Module):
            obj = obj.state_dict()
        _, leaves = flatten(obj)
        return internal.prepare_staging(self.repo, leaves, self.background)

    def _collect(self) -> None:
        repo, policy, grace = self.repo, self.retention, self.grace_seconds
        assert policy is not None
        if self.blocking:
            internal.collect(repo, policy, grace_seconds=grace)
        else:
            internal.run_after(repo, lambda: internal.collect(repo, policy, grace_seconds=grace))

    def wait(self) -> Version | None:
        """Wait for the saves (and gc, and a drill) in flight and raise their errors.

        Returns:
            The last Version saved, or None.
        """
        self.repo.wait()
        if self.drills is not None:
            self.drills.wait()
        internal.unhook_finished_snapshots(self.repo)   # the training thread, between steps
        if isinstance(self.last, Version) or self.last is None:
            return self.last
        return self.last.wait()

    def close(self) -> Version | None:
        """Wait for everything in flight, end the guard's holds and, when this Checkpointer opened
        the repository (it was given a path), close that handle: nothing of it runs afterwards.

        Returns:
            The last Version saved, or None.
        """
        try:
            return self.wait()
        finally:
            try:
                if self.guard is not None:
                    self.guard.close()
            finally:
                if self._owns_repo:
                    self.repo.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
            return
        try:   # unwinding an error: finish what is in flight, but the error in hand is the one raised
            self.repo.wait()
        except BaseException:  # noqa: BLE001
            pass
        finally:
            if self.guard is not None:
                self.guard.close()
            if self._owns_repo:
                try:
                    self.repo.close()
                except BaseException:  # noqa: BLE001
                    pass
