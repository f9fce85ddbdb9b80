"""Which version a divergence guard rolls back to.

A *candidate* is a version that parses, holds the parts the guard restores (its saved tree has
a ``model`` entry when a model is restored, and so on), records a step below ``bad_start -
margin`` (the estimated start of the bad stretch, less the guard's margin), was never abandoned
by a rollback (its own or an earlier run's, read from the repository's event records), and
belongs to this run: saved after the guard started, or, for a resumed run, at or before the step
it resumed from.  Versions of another run
sharing the repository are never candidates.

Example::

    found = candidates(repo, before=140, excluded=set(), preexisting=set(), start_step=None, needs=("model",))
    ordered = choose(repo, found, "best:val_loss")   # the best by val_loss first, then newest first
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..api import Repo, internal
from ..errors import DeltackptError, UnknownVersionError
from ..format.refs import parse_best, parse_revision


@dataclass(frozen=True)
class Candidate:
    id: str
    step: int
    time: float
    metrics: dict[str, Any] = field(default_factory=dict)


def _holds(tree: Any, needs: tuple[str, ...]) -> bool:
    return isinstance(tree, dict) and all(k in tree for k in needs)


def candidates(repo: Repo, *, before: int, excluded: set[str], preexisting: set[str],
               start_step: int | None, needs: tuple[str, ...]) -> list[Candidate]:
    """Every candidate with a step below ``before``, newest step first (then newest time).  The
    step filters on each manifest's head; only a version that passes is summarized (its tree, to
    see what it holds), and none is decoded whole: a rollback after a long history waits on no
    more than that."""
    out = []
    for vid, err in internal.newest_first(repo):
        if err is not None or vid in excluded:
            continue
        head = internal.head(repo, vid)
        if head.step is None or head.step >= before:
            continue
        if vid in preexisting and (start_step is None or head.step > start_step):
            continue   # another run's, or a future this resumed run did not take
        try:
            m = internal.summary(repo, vid)
        except DeltackptError:
            continue   # its manifest is damaged beyond the head: no candidate
        if _holds(m.tree, needs):
            out.append(Candidate(vid, head.step, head.time, dict(head.metrics)))
    out.sort(key=lambda c: (c.step, c.time if c.time == c.time else float("-inf"), c.id), reverse=True)
    return out


def choose(repo: Repo, found: list[Candidate], target: str | None) -> list[Candidate]:
    """``found`` in the order to try: the version ``target`` names first when it is a candidate
    (``best:METRIC`` is judged among candidates only, so a bad stretch's best value never wins),
    then the rest newest first."""
    if not target or not found:
        return list(found)
    first: Candidate | None = None
    base = parse_revision(target).base
    if base.startswith("best:") and parse_revision(target).back == 0:
        metric, direction = parse_best(base)
        scored = [c for c in found if _number(c.metrics.get(metric)) is not None]
        if scored:
            sign = -1.0 if direction == "max" else 1.0
            # (_number is a float for every candidate in scored: the filter above)
            first = min(scored, key=lambda c: (sign * _number(c.metrics[metric]), -c.step))  # type: ignore[operator]
    else:
        try:
            vid = internal.resolve_id(repo, target)
        except UnknownVersionError:
            vid = None
        first = next((c for c in found if c.id == vid), None)
    if first is None:
        return list(found)
    return [first] + [c for c in found if c is not first]


def _number(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
        return float(v)
    return None


def later_than(repo: Repo, step: int, preexisting: set[str]) -> set[str]:
    """This run's versions saved at a step after ``step``: what a rollback to ``step`` abandons."""
    out = set()
    for vid, err in internal.newest_first(repo):
        if err is None and vid not in preexisting:
            s = internal.head(repo, vid).step
            if s is not None and s > step:
                out.add(vid)
    return out
