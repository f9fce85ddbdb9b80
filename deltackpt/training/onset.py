"""Where a bad stretch began, estimated from a series' recent values when a rule fires.

A rule fires some steps after a run went bad (a sustained rise is seen once most of a window has
risen; a spike rule may let a slow climb join its history first), and a version saved between the
onset and the detection holds weights that were already bad.  So the guard bounds its rollback
target by the onset, not the detection.

The estimate is a change point: each value scores +1 when it is past the series' healthy limit (or
not finite) and -1 otherwise, and the onset is the start of the trailing stretch whose score sum
is largest, the earliest one on a tie.  Counting signs, not sizes, lets a few healthy-looking
values inside the bad stretch (a noisy loss) or a few high ones before it move the estimate by
no more than they are many.

Example::

    points = [(1, 1.2), (2, 1.1), (3, 1.3), (4, 2.6), (5, 2.4), (6, 2.9)]
    assert estimate(points, limit=1.8) == 4
"""

from __future__ import annotations

import math
from typing import Sequence


def estimate(points: Sequence[tuple[int, float]], limit: float | None, *, direction: str = "up",
             lookback: int | None = None) -> int:
    """The step the bad stretch ending at ``points[-1]`` began at.  ``points``: ``(step, value)``
    oldest first, the value that fired last; ``limit``: the healthy limit (None: only non-finite
    values count as bad); ``lookback``: consider only that many of the latest points."""
    if not points:
        raise ValueError("estimate needs at least the value that fired")
    if lookback is not None:
        points = points[max(0, len(points) - max(1, lookback)):]
    best_sum, best_at, total = -math.inf, len(points) - 1, 0
    for i in range(len(points) - 1, -1, -1):
        total += 1 if _bad(points[i][1], limit, direction) else -1
        if total >= best_sum:   # >=: the earliest start among equal sums
            best_sum, best_at = total, i
    return int(points[best_at][0])


def _bad(value: float, limit: float | None, direction: str) -> bool:
    if not math.isfinite(value):
        return True
    if limit is None:
        return False
    return value > limit if direction == "up" else value < limit
