"""How a divergence guard judges a series of reported values (a loss, a gradient norm, a metric).

A value that is NaN or infinite always fires.  Otherwise a *rule* compares it with the recent
healthy values of its series: :class:`Spike` (the default) with their median and median absolute
deviation, :class:`Ratio` with their exponential moving average.  Values that fire never join the
history, so a bad stretch does not teach the rule that bad is normal.  Rules hold no torch: a
policy simulation or a test feeds them plain floats.

Example::

    rule = Spike(window=100, threshold=8.0)
    for step, loss in enumerate(losses):
        verdict = rule.judge("loss", loss)
        if verdict is None:
            rule.add(loss)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..errors import InvalidArgumentError

MAD_TO_SIGMA = 1.4826   # a normal distribution's standard deviation is 1.4826 x its MAD


@dataclass(frozen=True)
class Verdict:
    """Why a value fired: ``rule`` is ``"nonfinite"`` or the rule's name, ``baseline`` what it
    was compared with (median, EMA) and ``threshold`` the bound it crossed (None for non-finite)."""

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
    """Base of the spike rules: ``judge`` a value against the history, ``add`` a healthy one."""

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


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
