"""Which versions to keep: one declarative policy shared by ``gc`` and the Checkpointer.

The union of every rule is kept; ``latest`` is always kept, and so is every version a live
process holds (:mod:`.holds`: a divergence guard's rollback target), whatever the rules say.
"""

from __future__ import annotations

import math
import numbers
import operator
import time
from dataclasses import dataclass

from ...errors import InvalidArgumentError
from ..repository import Repository
from .holds import held


@dataclass(frozen=True)
class Retention:
    """Which versions gc keeps: the last N, the best K by a metric, one version every K steps,
    everything newer than a duration, and tagged versions (the union of the rules; ``latest``
    always).

    "Last" is history order, not the clock: ``keep_last=3`` keeps ``latest``, ``latest~1`` and
    ``latest~2`` (first parents), however skewed the clocks of the writers that saved them.  Every
    rule is checked when the policy is made, so a bad one is refused before gc takes a lock.

    Args:
        keep_last: keep ``latest`` and its N-1 first-parent ancestors.
        keep_best: the best versions by a metric: ``("val_loss", 2, "min")``, or the text
            ``"val_loss:2"`` (lower is better) or ``"accuracy:3:max"``.
        keep_every: keep one version every this many steps.
        keep_within: keep the versions saved in the last this many seconds.
        keep_tags: keep tagged versions.

    Raises:
        InvalidArgumentError: a rule out of range.

    Example:
        ```python
        Retention(keep_last=3, keep_best=("val_loss", 2, "min"), keep_every=1000)
        ```
    """

    keep_last: int | None = None
    keep_best: tuple[str, int, str] | None = None   # (metric, count, "min" | "max")
    keep_every: int | None = None                   # steps
    keep_within: float | None = None                # seconds
    keep_tags: bool = True

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - frozen
        set_("keep_last", _count("keep_last", self.keep_last, 0))
        set_("keep_every", _count("keep_every", self.keep_every, 1))
        set_("keep_within", _seconds("keep_within", self.keep_within))
        set_("keep_best", _best(self.keep_best))
        if not isinstance(self.keep_tags, bool):
            raise InvalidArgumentError(f"keep_tags must be True or False, got {self.keep_tags!r:.80}")

    @staticmethod
    def parse_best(text: str) -> tuple[str, int, str]:
        """``val_loss:2`` (lower is better) or ``accuracy:3:max``."""
        parts = text.split(":")
        try:
            if len(parts) == 2:
                return parts[0], int(parts[1]), "min"
            if len(parts) == 3 and parts[2] in ("min", "max"):
                return parts[0], int(parts[1]), parts[2]
        except ValueError:
            pass
        raise InvalidArgumentError(f"keep_best (--keep-best) takes METRIC:COUNT[:min|max], got {text!r:.80}")

    def select(self, repo: Repository, now: float | None = None) -> dict[str, list[str]]:
        """Map each kept version id to the reasons it is kept."""
        now = time.time() if now is None else now
        history = repo.history_order()  # newest first
        kept: dict[str, list[str]] = {}

        def keep(vid: str, why: str) -> None:
            kept.setdefault(vid, []).append(why)

        latest = repo.latest()
        if latest:
            keep(latest, "latest")
        if self.keep_last is None and self.keep_best is None and self.keep_every is None and self.keep_within is None:
            for vid in history:
                keep(vid, "no rule removes it")
        if self.keep_last:
            for vid in history[: self.keep_last]:
                keep(vid, f"last {self.keep_last}")
        if self.keep_best:
            metric, count, direction = self.keep_best
            recorded = [(repo.head(v).metrics.get(metric), v) for v in history]
            scored = [(float(s), v) for s, v in recorded
                      if isinstance(s, (int, float)) and not isinstance(s, bool) and s == s]
            # stable: of equal scores the newer in history wins
            scored.sort(key=lambda x: -x[0] if direction == "max" else x[0])
            for _, vid in scored[:count]:
                keep(vid, f"best {count} by {metric}")
        if self.keep_every:
            buckets: dict[int, str] = {}
            for vid in reversed(history):  # oldest first: the first version in each bucket
                step = repo.head(vid).step
                if step is not None:
                    buckets.setdefault(step // self.keep_every, vid)
            for vid in buckets.values():
                keep(vid, f"every {self.keep_every} steps")
        if self.keep_within is not None:
            for vid in history:
                if now - repo.head(vid).time <= self.keep_within:
                    keep(vid, f"within {self.keep_within:g}s")
        if self.keep_tags:
            for name, vid in repo.tags().items():
                keep(vid, f"tag {name}")
        present = set(history)
        for vid, why in held(repo.store).items():  # a live run's rollback target (holds.py)
            if vid in present:
                keep(vid, why)
        return kept


def check_metric_recorded(repo: Repository, metric: str) -> None:
    """InvalidArgumentError when the repository has versions and none records a number for
    ``metric``: a ``keep_best`` rule on it would keep nothing, and the gc asked to keep the best by
    it would remove what the user meant it to keep (``val_loss`` typed where versions record
    ``loss``).  Run by :func:`deltackpt.gc` (and the CLI), not by a Checkpointer's gc, whose first
    versions may precede the first evaluation."""
    recorded: dict[str, None] = {}
    versions = 0
    for vid, err in repo.newest_first():   # metrics are in the heads: no manifest built
        if err is not None:
            continue
        versions += 1
        m = repo.head(vid)
        value = m.metrics.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            return
        for name in m.metrics:
            recorded.setdefault(name)
    if versions:
        names = ", ".join(sorted(recorded)[:10]) + (" ..." if len(recorded) > 10 else "") if recorded else "none"
        raise InvalidArgumentError(f"keep_best (--keep-best): no version of {repo.location} records a number for the "
                                   f"metric {metric!r:.80}, so the rule would keep nothing; metrics recorded: "
                                   f"{names}; nothing was removed")


def _count(name: str, value: object, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        # (anything without __index__ raises TypeError: caught below)
        n = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if n is None or n < minimum:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r:.80}")
    return n


def check_seconds(name: str, value: object, *, allow_inf: bool = False) -> float:
    """``value`` as a float of seconds >= 0 (not NaN; infinite only with ``allow_inf``), else
    :class:`InvalidArgumentError` naming ``name``."""
    seconds = _seconds(name, value, allow_inf)
    if seconds is None:
        raise InvalidArgumentError(f"{name} must be a number of seconds, got None")
    return seconds


def _seconds(name: str, value: object, allow_inf: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r:.80}")
    seconds = float(value)
    if seconds != seconds or seconds < 0 or (seconds == math.inf and not allow_inf):
        raise InvalidArgumentError(f"{name} must be a {'' if allow_inf else 'finite '}number of seconds >= 0, "
                                   f"got {value!r:.80}")
    return seconds


def _best(value: object) -> tuple[str, int, str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = Retention.parse_best(value)
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise InvalidArgumentError(f"keep_best must be (metric, count, 'min'|'max') or 'METRIC:COUNT[:min|max]', "
                                   f"got {value!r:.80}")
    metric, count, direction = value
    if not isinstance(metric, str) or not metric or direction not in ("min", "max"):
        raise InvalidArgumentError(f"keep_best must be (metric, count, 'min'|'max'), got {value!r:.80}")
    n = _count("keep_best's count", count, 0)
    assert n is not None
    return metric, n, direction
