"""When to checkpoint: small policy objects a :class:`~deltackpt.Checkpointer` asks every step.

A policy answers ``due(step, now, metrics)`` and is told about every save with
``saved(step, now, cost, metrics)`` (``cost``: seconds the training loop was blocked).  Policies
hold no torch and no repository, so ``bench/policy_sim.py`` runs the same objects in simulated
time.

Example::

    from deltackpt.training.policies import EveryN, YoungDaly, OnImprovement
    ckpt = deltackpt.Checkpointer("ckpt", policy=[YoungDaly(mtbf=3600), OnImprovement("val_loss")])
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ..errors import DeltackptError

if TYPE_CHECKING:   # (no import at run time: policies hold no torch and no repository)
    from ..api.types import Metrics


class Policy:
    """Base class: never due on its own."""

    def due(self, step: int, now: float, metrics: Metrics) -> bool:
        return False

    def saved(self, step: int, now: float, cost: float, metrics: Metrics) -> None:
        """A version was saved (for any reason) at ``step``; ``cost`` seconds of stall."""

    def resumed(self, step: int, now: float) -> None:
        """Training restarted from a version saved at ``step``: schedules continue from there."""

    def recall(self, history: "list[Metrics]") -> None:
        """A resumed run's earlier versions (their metrics, oldest first, those saved at or before
        the resumed step): policies that compare against the past pick up where they were."""

    def restore_measured(self, seconds: float) -> None:
        """A rollback drill measured how long restoring the newest version takes: policies that
        weigh a restart's cost use it instead of a guess."""

    def describe(self) -> str:
        return type(self).__name__


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise DeltackptError(f"{name} must be a positive number, got {value!r}")


class EveryN(Policy):
    """Save at every multiple of ``steps``: steps N, 2N, 3N, ..., whatever else saves in between
    (``[EveryN(20), YoungDaly(...)]`` saves at 20, 40, 60 and when YoungDaly is due).  A loop that
    skips the multiple itself saves at the first step past it; a multiple already saved (a resumed
    run, a rollback to it) is not saved again.

    Args:
        steps: the steps between saves.

    Raises:
        DeltackptError: ``steps`` is not a positive number.

    Example:
        ```python
        Checkpointer("ckpt", policy=EveryN(500))     # Checkpointer("ckpt", policy=500) is the same
        ```
    """

    def __init__(self, steps: int) -> None:
        _positive("steps", steps)
        self.steps = int(steps)
        self.last: int | None = None

    def due(self, step: int, now: float, metrics: Metrics) -> bool:
        # the phase is the step's, not the last save's: another policy's save does not shift it
        return step // self.steps > (self.last if self.last is not None else 0) // self.steps


    def saved(self, step: int, now: float, cost: float, metrics: Metrics) -> None:
        self.last = step

    def resumed(self, step: int, now: float) -> None:
        self.last = step

    def describe(self) -> str:
        return f"every {self.steps} steps"


class EveryT(Policy):
    """Save when ``seconds`` have passed since the last save (or since the first step seen).

    Args:
        seconds: the time between saves, on the Checkpointer's clock.

    Raises:
        DeltackptError: ``seconds`` is not a positive number.

    Example:
        ```python
        Checkpointer("ckpt", policy=EveryT(15 * 60))
        ```
    """

    def __init__(self, seconds: float) -> None:
        _positive("seconds", seconds)
        self.seconds = float(seconds)
        self.last: float | None = None

    def due(self, step: int, now: float, metrics: Metrics) -> bool:
        if self.last is None:
            self.last = now
        return now - self.last >= self.seconds

    def saved(self, step: int, now: float, cost: float, metrics: Metrics) -> None:
        self.last = now

    def resumed(self, step: int, now: float) -> None:
        self.last = now

    def describe(self) -> str:
        return f"every {self.seconds:g} s"


class YoungDaly(Policy):
    """Save every ``sqrt(2 * C * (MTBF + R))`` seconds (Young 1974; the restart term is Daly's
    first-order model, 2006).

    C is the measured cost of a save (an exponential moving average of the stalls, so the interval
    follows the cost as it changes), MTBF the mean time between failures you give, and R the
    restart cost: ``restart_cost`` plus the restore time the last rollback drill measured
    (``Checkpointer(drill_every=...)``, ``deltackpt drill``; 0 until one has).  A 0.05 s stall, a
    4 h MTBF and no restart cost give sqrt(2 * 0.05 * 14400) = 38 s; a measured 30 s restore makes
    it sqrt(2 * 0.05 * 14430) = 38.0 s (R matters when it is a sizeable part of the MTBF).

    Args:
        mtbf: the mean time between failures, in seconds.
        initial_cost: stands in for C until a save has been measured (seconds).
        smoothing: the weight of the newest save's cost in the moving average.
        min_interval: never save more often than this (seconds).
        restart_cost: seconds from a failure to a process ready to load, which nothing here can
            measure.

    Raises:
        DeltackptError: ``mtbf`` or ``initial_cost`` not positive, ``restart_cost`` negative.

    Example:
        ```python
        Checkpointer("ckpt", policy=YoungDaly(mtbf=4 * 3600, restart_cost=120), drill_every=20)
        ```
    """

    def __init__(self, mtbf: float, *, initial_cost: float = 1.0, smoothing: float = 0.3,
                 min_interval: float = 0.0, restart_cost: float = 0.0) -> None:
        _positive("mtbf", mtbf)
        _positive("initial_cost", initial_cost)
        if isinstance(restart_cost, bool) or not isinstance(restart_cost, (int, float)) or \
                not 0 <= restart_cost < math.inf:
            raise DeltackptError(f"restart_cost must be a number of seconds >= 0, got {restart_cost!r}")
        self.mtbf = float(mtbf)
        self.cost = float(initial_cost)
        self.smoothing = smoothing
        self.min_interval = min_interval
        self.restart_cost = float(restart_cost)
        self.restore: float | None = None
        """The last drill's restore time (seconds), once one has been measured."""
        self.measured = False
        self.last: float | None = None

    @property
    def interval(self) -> float:
        restart = self.restart_cost + (self.restore or 0.0)
        return max(self.min_interval, math.sqrt(2.0 * self.cost * (self.mtbf + restart)))

    def restore_measured(self, seconds: float) -> None:
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < math.inf:
            self.restore = float(seconds)

    def due(self, step: int, now: float, metrics: Metrics) -> bool:
        if self.last is None:
            self.last = now
        return now - self.last >= self.interval

    def saved(self, step: int, now: float, cost: float, metrics: Metrics) -> None:
        self.last = now
        if cost >= 0:
            self.cost = cost if not self.measured else (1 - self.smoothing) * self.cost + self.smoothing * cost
            self.measured = True

    def resumed(self, step: int, now: float) -> None:
        self.last = now

    def describe(self) -> str:
        restore = "" if self.restore is None else f", measured restore {self.restore:.3g} s"
        return f"Young/Daly (MTBF {self.mtbf:g} s{restore}, interval {self.interval:.3g} s)"


class DenseEarly(Policy):
    """Checkpoint densely early and sparsely later (COCI-like).

    The gap between saves starts at ``first`` steps and grows by ``growth`` after every save, up to
    ``max_every`` steps.  Early versions are the ones an exploratory run most often rolls back to
    (the model changes fastest and jobs die most often early); later ones cost the same but buy less.

    Args:
        first: the step of the first save, and the first gap.
        growth: the factor each gap grows by.
        max_every: the largest gap, in steps.

    Example:
        ```python
        DenseEarly(first=10, growth=1.5, max_every=2000)   # saves at steps 10, 25, 47, 81, ...
        ```
    """

    def __init__(self, first: int = 10, growth: float = 1.5, max_every: int = 1000) -> None:
        _positive("first", first)
        _positive("max_every", max_every)
        if not isinstance(growth, (int, float)) or growth < 1:
            raise DeltackptError(f"growth must be >= 1, got {growth!r}")
        self.first = float(first)
        self.gap = float(first)
        self.growth = float(growth)
        self.max_every = int(max_every)
        self.last: int | None = None

    def due(self, step: int, now: float, metrics: Metrics) -> bool:
        return step - (self.last if self.last is not None else 0) >= round(self.gap)

    def saved(self, step: int, now: float, cost: float, metrics: Metrics) -> None:
        self.gap = min(self.max_every, self.gap * self.growth)
        self.last = step

    def resumed(self, step: int, now: float) -> None:
        # the schedule is a function of the step, not of the process: replay it up to ``step``
        point, gap = 0.0, self.first
        while point + round(gap) <= step:
            point += round(gap)
            gap = min(self.max_every, gap * self.growth)
        self.gap, self.last = gap, step

    def describe(self) -> str:
        return f"dense early (gap {round(self.gap)} steps, x{self.growth:g}, max {self.max_every})"


class OnImprovement(Policy):
    """Save when ``metric`` improves on the best value seen so far.  Steps that do not report the
    metric are never due.

    Args:
        metric: the name of the reported value.
        mode: ``"min"`` (lower is better) or ``"max"``.
        min_delta: the least improvement that counts.

    Raises:
        DeltackptError: ``mode`` is neither ``"min"`` nor ``"max"``.

    Example:
        ```python
        Checkpointer("ckpt", policy=[EveryN(1000), OnImprovement("val_loss")])
        ```
    """

    def __init__(self, metric: str, mode: str = "min", min_delta: float = 0.0) -> None:
        if mode not in ("min", "max"):
            raise DeltackptError(f"mode must be 'min' or 'max', got {mode!r}")
        self.metric, self.mode, self.min_delta = metric, mode, float(min_delta)
        self.best: float | None = None

    def _value(self, metrics: Metrics) -> float | None:
        v = metrics.get(self.metric) if metrics else None
        item = getattr(v, "item", None)   # a 0-d tensor or numpy scalar
        if item is not None:
            v = item()
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None

    def due(self, step: int, now: float, metrics: Metrics) -> bool:
        v = self._value(metrics)
        if v is None:
            return False
        if self.best is None:
            return True
        return v < self.best - self.min_delta if self.mode == "min" else v > self.best + self.min_delta

    def saved(self, step: int, now: float, cost: float, metrics: Metrics) -> None:
        v = self._value(metrics)
        if v is not None and (self.best is None or (v < self.best if self.mode == "min" else v > self.best)):
            self.best = v

    def recall(self, history: "list[Metrics]") -> None:
        for metrics in history:
            self.saved(0, 0.0, 0.0, metrics)

    def describe(self) -> str:
        return f"on improvement of {self.metric} ({self.mode})"


class AnyOf(Policy):
    """Due when any of ``policies`` is; every one of them hears about every save.

    Args:
        *policies: the policies.

    Example:
        ```python
        AnyOf(EveryT(3600), OnImprovement("val_loss"))     # a list to Checkpointer does the same
        ```
    """

    def __init__(self, *policies: Policy) -> None:
        self.policies = list(policies)

    def due(self, step: int, now: float, metrics: Metrics) -> bool:
        # evaluate all (no short circuit): time-based policies start their clocks on first sight
        return any([p.due(step, now, metrics) for p in self.policies])

    def saved(self, step: int, now: float, cost: float, metrics: Metrics) -> None:
        for p in self.policies:
            p.saved(step, now, cost, metrics)

    def resumed(self, step: int, now: float) -> None:
        for p in self.policies:
            p.resumed(step, now)

    def recall(self, history: "list[Metrics]") -> None:
        for p in self.policies:
            p.recall(history)

    def restore_measured(self, seconds: float) -> None:
        for p in self.policies:
            p.restore_measured(seconds)

    def describe(self) -> str:
        return " or ".join(p.describe() for p in self.policies)


def as_policy(policy: "Policy | int | Sequence[Policy | int] | None") -> Policy:
    """``int`` -> EveryN; list/tuple -> AnyOf; None -> EveryN(1000)."""
    if policy is None:
        return EveryN(1000)
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, int) and not isinstance(policy, bool):
        return EveryN(policy)
    if isinstance(policy, (list, tuple)):
        return AnyOf(*(as_policy(p) for p in policy))
    raise DeltackptError(f"policy must be a Policy, an int (every N steps) or a list of them, got {policy!r}")
