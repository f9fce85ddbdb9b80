"""How a divergence guard judges a series of reported values (a loss, a gradient norm, a metric).

A value that is NaN or infinite always fires.  Otherwise a *rule* compares it with the recent
values of its series: :class:`Spike` a value with the median and median absolute deviation of the
healthy ones, :class:`Ratio` with their exponential moving average, :class:`Sustained` the level of
the last few values (their median) with the best level of the recent past.  Values that fire never
join a spike rule's history, so a bad stretch does not teach it that bad is normal; a bad stretch
that rises too slowly to fire it does join it, which is what :class:`Sustained` is for.  The
guard's default is both, ``Rules(Spike(), Sustained())``.  Rules hold no torch: a policy
simulation or a test feeds them plain floats.

Example::

    rule = Rules(Spike(window=100, threshold=8.0), Sustained(window=20))
    for step, loss in enumerate(losses):
        verdict = rule.judge("loss", loss)
        rule.observe(loss, healthy=verdict is None)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..errors import InvalidArgumentError

MAD_TO_SIGMA = 1.4826   # a normal distribution's standard deviation is 1.4826 x its MAD
#: where a series' healthy band ends, in robust standard deviations above its baseline: what the
#: onset of a bad stretch is estimated against (a normal value passes it 0.1% of the time)
HEALTHY_SIGMAS = 3.0
#: ... and at least this fraction of the baseline
HEALTHY_FLOOR = 0.02


@dataclass(frozen=True)
class Verdict:
    """Why a value fired: ``rule`` is ``"nonfinite"`` or the rule's name, ``value`` what crossed
    (the reported value; for ``"sustained"`` the median of its window), ``baseline`` what it was
    compared with (median, EMA, best level) and ``threshold`` the bound it crossed (None for
    non-finite)."""

    metric: str
    rule: str
    value: float
    threshold: float | None = None
    baseline: float | None = None


def _positive(name: str, value: object, *, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    # (ok says value is a number; mypy does not narrow through the flag)
    if isinstance(value, bool) or not ok or not value > 0 or (  # type: ignore[operator]
            not integer and not math.isfinite(value)):  # type: ignore[arg-type]
        raise InvalidArgumentError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r:.60}")


class Rule:
    """Base of the rules: ``judge`` a value against the history, then ``observe`` it (``add``: a
    healthy one)."""

    name = "rule"

    def __init__(self, min_history: int, direction: str) -> None:
        _positive("min_history", min_history, integer=True)
        if direction not in ("up", "down"):
            raise InvalidArgumentError(f"direction must be 'up' (a loss) or 'down' (an accuracy), got {direction!r}")
        self.min_history, self.direction = min_history, direction
        self.seen = 0

    def bound(self) -> tuple[float, float] | None:
        """(baseline, threshold) once the history is long enough, else None."""
        raise NotImplementedError

    def judge(self, metric: str, value: float) -> Verdict | None:
        """A Verdict when ``value`` fires (non-finite, or past the threshold), else None."""
        if not math.isfinite(value):
            return Verdict(metric, "nonfinite", value)
        found = self.bound()
        if found is None:
            return None
        baseline, limit = found
        crossed = value > limit if self.direction == "up" else value < limit
        return Verdict(metric, self.name, value, limit, baseline) if crossed else None

    def add(self, value: float) -> None:
        self.seen += 1

    def observe(self, value: float, healthy: bool) -> None:
        """Take this step's value into the history, after :meth:`judge`: ``healthy`` is False when
        a rule fired at this step (on this series or another).  A spike rule keeps healthy values
        only; :class:`Sustained` keeps every finite one."""
        if healthy and math.isfinite(value):
            self.add(value)

    def healthy_limit(self, verdict: Verdict) -> tuple[float | None, int | None]:
        """For estimating where a bad stretch began (:mod:`.onset`): where this series' healthy
        band ends (here: halfway from the baseline to the threshold of ``verdict``, or of the
        history now for a non-finite value; :class:`Spike` and :class:`Sustained` use
        ``HEALTHY_SIGMAS`` robust deviations), and how many of the latest values the estimate may
        look at (None: no bound of this rule's own)."""
        found = (verdict.baseline, verdict.threshold) if verdict.baseline is not None and \
            verdict.threshold is not None else self.bound()
        if found is None:
            return None, None
        return 0.5 * (found[0] + found[1]), None

    def reach(self) -> int | None:
        """How many of the latest values a bad stretch this rule fired on now could span (None:
        no bound of its own); the guard holds a version older than that."""
        return None

    def names(self) -> list[str]:
        """The rule names a verdict of this rule may carry (besides ``"nonfinite"``)."""
        return [self.name]

    def fresh(self) -> "Rule":
        """A rule with these settings and no history (one per watched series)."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


class Spike(Rule):
    """Fires when a value passes the median of the last ``window`` healthy values by more than
    ``threshold`` robust standard deviations (1.4826 x the median absolute deviation).  The
    deviation is taken as at least ``floor`` x |median|, so a plateau (MAD near 0) does not turn
    the smallest wiggle into a spike.  ``direction="down"`` watches a metric that must not fall.

    Median and MAD move with neither a few outliers nor a steady trend, which is why this is the
    default: on the benchmark's real runs (MiniLM fine-tunes, a recommendation model with Zipf
    ids, a small GPT from scratch; 300 steps, batch sizes down to 2) the highest loss stays below
    4.2 deviations, and a poisoned batch or a learning-rate blow-up lands far above 8.  Gradient
    norms reach 9.6 on the same runs: watch them with ``Spike(threshold=20)``.

    Example: ``Spike(window=100, threshold=8.0)``
    """

    name = "spike"

    def __init__(self, window: int = 100, threshold: float = 8.0, *, min_history: int = 20,
                 direction: str = "up", floor: float = 0.02) -> None:
        super().__init__(min_history, direction)
        _positive("window", window, integer=True)
        _positive("threshold", threshold)
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor < math.inf:
            raise InvalidArgumentError(f"floor must be a number >= 0, got {floor!r:.60}")
        self.window, self.threshold, self.floor = window, float(threshold), float(floor)
        self.values: deque[float] = deque(maxlen=window)

    def bound(self) -> tuple[float, float] | None:
        if len(self.values) < self.min_history:
            return None
        ordered = sorted(self.values)
        median = _median(ordered)
        mad = _median(sorted(abs(v - median) for v in ordered))
        sigma = max(MAD_TO_SIGMA * mad, self.floor * abs(median), 1e-12)
        sign = 1.0 if self.direction == "up" else -1.0
        return median, median + sign * self.threshold * sigma

    def add(self, value: float) -> None:
        super().add(value)
        self.values.append(float(value))

    def healthy_limit(self, verdict: Verdict) -> tuple[float | None, int | None]:
        # the healthy band: the median and HEALTHY_SIGMAS robust deviations, not the threshold
        found = self.bound()
        if found is None:
            return None, None
        median, limit = found
        return median + (limit - median) * HEALTHY_SIGMAS / self.threshold, None

    def fresh(self) -> "Spike":
        return Spike(self.window, self.threshold, min_history=self.min_history, direction=self.direction,
                     floor=self.floor)

    def describe(self) -> str:
        return f"median + {self.threshold:g} MAD-sigma over {self.window} values ({self.direction})"


class Ratio(Rule):
    """Fires when a value exceeds ``factor`` x the exponential moving average of the healthy
    values (``alpha``: the weight of each new one), or falls below average / ``factor`` with
    ``direction="down"``.  For series that stay positive (losses, gradient norms).

    Example: ``Ratio(factor=3.0, alpha=0.05)``
    """

    name = "ratio"

    def __init__(self, factor: float = 3.0, alpha: float = 0.05, *, min_history: int = 20,
                 direction: str = "up") -> None:
        super().__init__(min_history, direction)
        _positive("factor", factor)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
            raise InvalidArgumentError(f"alpha must be in (0, 1], got {alpha!r:.60}")
        self.factor, self.alpha = float(factor), float(alpha)
        self.ema: float | None = None

    def bound(self) -> tuple[float, float] | None:
        if self.ema is None or self.seen < self.min_history:
            return None
        limit = self.ema * self.factor if self.direction == "up" else self.ema / self.factor
        return self.ema, limit

    def add(self, value: float) -> None:
        super().add(value)
        self.ema = float(value) if self.ema is None else (1 - self.alpha) * self.ema + self.alpha * float(value)

    def fresh(self) -> "Ratio":
        return Ratio(self.factor, self.alpha, min_history=self.min_history, direction=self.direction)

    def describe(self) -> str:
        return f"{self.factor:g} x EMA (alpha {self.alpha:g}, {self.direction})"


class Sustained(Rule):
    """Fires when a series stays bad: the median of its last ``window`` values (this one included)
    rises above the best such median of the last ``memory`` steps (the lowest, for a loss) by more
    than ``rise`` x that best level *and* by more than ``spread`` x the series' usual noise (the
    median, over the windows whose level lies in the healthy band, of each window's robust standard
    deviation: 1.4826 x its median absolute deviation), so a noisy series needs a larger rise, and
    a bad stretch's own noise does not raise the bar it is judged by.  The healthy band reaches
    ``HEALTHY_SIGMAS`` (3) robust deviations of the best window's values above the best level (at
    least 2% of it); the guard estimates where a bad stretch began as the first value of the
    run-up past it.  Every finite value counts, whether
    or not it fired another rule, so a loss that climbs too slowly for :class:`Spike` to see still
    moves the level.  It judges once ``min_history`` values are in (default: half the window).
    ``direction="down"``: a metric that must not fall.

    A median moves only when most of the window has moved: a few spikes do not fire it, a loss that
    doubled and stays there fires it some ``window / 2`` steps after the rise.  The best level is
    forgotten after ``memory`` steps, so a slow legitimate drift (a schedule, a harder stretch of
    data) is measured against the recent past, not the run's best.  On the recorded clean runs
    (bench/guard_traces.py: MiniLM fine-tunes at batch sizes 1 to 16, a recommendation model, small
    GPTs, an MLP classifier whose loss falls 100-fold) the loss's level came at most 0.55 of the
    way to firing (tests/training/test_guard_traces.py); a learning rate raised to 0.5 on a MiniLM
    fine-tune fires it (bench/guard_lr.py).  Gradient norms rise legitimately early in a
    fine-tune (the same runs fire it): watch them with :class:`Spike` alone.

    Example: ``Sustained(window=20, rise=0.5, spread=6.0, memory=200)``
    """

    name = "sustained"

    def __init__(self, window: int = 20, rise: float = 0.5, spread: float = 6.0, memory: int = 200, *,
                 min_history: int | None = None, direction: str = "up") -> None:
        _positive("window", window, integer=True)
        super().__init__(max(1, window // 2) if min_history is None else min_history, direction)
        _positive("rise", rise)
        if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not 0 <= spread < math.inf:
            raise InvalidArgumentError(f"spread must be a number >= 0, got {spread!r:.60}")
        _positive("memory", memory, integer=True)
        self.window, self.rise, self.spread, self.memory = window, float(rise), float(spread), memory
        self.values: deque[float] = deque(maxlen=window)
        # (median, robust standard deviation, values seen when taken) of each window
        self.levels: deque[tuple[float, float, int]] = deque(maxlen=memory)
        # the candidates for the best of the last `memory` levels, best first (a sliding-window
        # minimum: each level enters and leaves once, so the best costs O(1) a step)
        self._best_first: deque[tuple[float, float, int]] = deque()
        self._sign = 1.0 if direction == "up" else -1.0

    def _best(self) -> tuple[float, float, int] | None:
        """The best level of the last ``memory`` (the earliest among equals)."""
        return self._best_first[0] if self._best_first else None

    def _band(self, best: tuple[float, float, int]) -> float:
        """How far above the best level (below, for ``direction="down"``) a healthy value may lie:
        ``HEALTHY_SIGMAS`` robust deviations of the best window's values, at least
        ``HEALTHY_FLOOR`` x the level (a plateau whose deviation is near 0)."""
        return max(HEALTHY_SIGMAS * best[1], HEALTHY_FLOOR * abs(best[0]), 1e-12)

    def _noise(self, best: tuple[float, float, int]) -> float:
        """The usual noise of the healthy windows (those whose level lies in the healthy band): a
        bad stretch's own noise must not widen the margin it is judged by."""
        edge = best[0] + self._sign * self._band(best)
        return _median(sorted(lv[1] for lv in self.levels if self._sign * (lv[0] - edge) <= 0))

    def _limit(self, best: tuple[float, float, int]) -> float:
        margin = max(self.rise * abs(best[0]), self.spread * self._noise(best), 1e-12)
        return best[0] + margin if self.direction == "up" else best[0] - margin

    def bound(self) -> tuple[float, float] | None:
        best = self._best()
        if best is None or len(self.values) < self.min_history:
            return None
        return best[0], self._limit(best)

    def judge(self, metric: str, value: float) -> Verdict | None:
        if not math.isfinite(value):
            return Verdict(metric, "nonfinite", value)
        best = self._best()
        recent = list(self.values)[max(0, len(self.values) - (self.window - 1)):]
        if best is None or len(recent) + 1 < self.min_history:
            return None
        level = _median(sorted([*recent, float(value)]))
        if self._sign * (level - best[0]) <= self.rise * abs(best[0]):
            return None   # within rise of the best: no margin is smaller, the noise need not be weighed
        limit = self._limit(best)
        return Verdict(metric, self.name, level, limit, best[0]) if self._sign * (level - limit) > 0 else None

    def add(self, value: float) -> None:
        super().add(value)
        self.values.append(float(value))
        if len(self.values) >= self.min_history:
            ordered = sorted(self.values)
            level = _median(ordered)
            sigma = MAD_TO_SIGMA * _median(sorted(abs(v - level) for v in ordered))
            entry = (level, sigma, self.seen)
            self.levels.append(entry)
            while self._best_first and self._sign * (self._best_first[-1][0] - level) > 0:
                self._best_first.pop()
            self._best_first.append(entry)
            while self._best_first[0][2] <= self.seen - self.memory:   # gone from `levels`
                self._best_first.popleft()

    def observe(self, value: float, healthy: bool) -> None:
        if math.isfinite(value):
            self.add(value)

    def healthy_limit(self, verdict: Verdict) -> tuple[float | None, int | None]:
        best = self._best()
        if best is None:
            return None, None
        return (best[0] + self._band(best) if self.direction == "up" else best[0] - self._band(best)), self.reach()

    def reach(self) -> int | None:
        # the best level's window was healthy: a bad stretch began after its first value (the
        # value judged has been observed by now)
        best = self._best()
        return None if best is None else self.seen - best[2] + self.window

    def fresh(self) -> "Sustained":
        return Sustained(self.window, self.rise, self.spread, self.memory, min_history=self.min_history,
                         direction=self.direction)

    def describe(self) -> str:
        return (f"median of {self.window} values past the best of the last {self.memory} by "
                f"{self.rise:g} x and {self.spread:g} x the noise ({self.direction})")


class Rules(Rule):
    """Several rules on one series: fires when any fires (a non-finite value first, then the
    rules in the order given); every rule observes every value.

    Example: ``Rules(Spike(), Sustained())`` (the guard's default)
    """

    name = "rules"

    def __init__(self, *rules: Rule) -> None:
        if not rules or not all(isinstance(r, Rule) for r in rules):
            raise InvalidArgumentError(f"Rules takes Rule objects (Spike(), Sustained(), ...), got {rules!r:.80}")
        self.rules = list(rules)
        super().__init__(min(r.min_history for r in rules), rules[0].direction)

    def judge(self, metric: str, value: float) -> Verdict | None:
        fired = None
        for rule in self.rules:
            verdict = rule.judge(metric, value)
            if verdict is not None and (fired is None or verdict.rule == "nonfinite"):
                fired = verdict
        return fired

    def bound(self) -> tuple[float, float] | None:
        return next((b for b in (r.bound() for r in self.rules) if b is not None), None)

    def add(self, value: float) -> None:
        super().add(value)
        for rule in self.rules:
            rule.add(value)

    def observe(self, value: float, healthy: bool) -> None:
        self.seen += 1
        for rule in self.rules:
            rule.observe(value, healthy)

    def healthy_limit(self, verdict: Verdict) -> tuple[float | None, int | None]:
        own = next((r for r in self.rules if verdict.rule in r.names()), None)
        if own is not None:
            return own.healthy_limit(verdict)
        for rule in self.rules:   # a non-finite value: the first rule that has a healthy band
            found = rule.healthy_limit(verdict)
            if found[0] is not None:
                return found
        return None, None

    def reach(self) -> int | None:
        found = [n for n in (r.reach() for r in self.rules) if n is not None]
        return max(found) if found else None

    def names(self) -> list[str]:
        return [n for r in self.rules for n in r.names()]

    def fresh(self) -> "Rules":
        return Rules(*(r.fresh() for r in self.rules))

    def describe(self) -> str:
        return " or ".join(r.describe() for r in self.rules)


def default_rule() -> Rule:
    """What a guard watches a series with unless told otherwise."""
    return Rules(Spike(), Sustained())


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
