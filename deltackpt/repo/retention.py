"""Which versions to keep: one declarative policy shared by ``gc`` and the Checkpointer.

The union of every rule is kept; ``latest`` is always kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import DeltackptError
from .repository import Repository


@dataclass(frozen=True)
class Retention:
    """Keep the last N, the best K by a metric, one version every K steps, everything newer than a
    duration, and tagged versions.

    Example::

        Retention(keep_last=3, keep_best=("val_loss", 2, "min"), keep_every=1000)
    """

    keep_last: int | None = None
    keep_best: tuple[str, int, str] | None = None   # (metric, count, "min" | "max")
    keep_every: int | None = None                   # steps
    keep_within: float | None = None                # seconds
    keep_tags: bool = True

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_every"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0 or (name == "keep_every" and v == 0)):
                raise DeltackptError(f"{name} must be a positive integer, got {v!r}")
        if self.keep_best is not None:
            metric, count, direction = self.keep_best
            if direction not in ("min", "max") or not isinstance(count, int) or count < 0:
                raise DeltackptError(f"keep_best must be (metric, count, 'min'|'max'), got {self.keep_best!r}")

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
        raise DeltackptError(f"--keep-best takes METRIC:COUNT[:min|max], got {text!r}")

    def select(self, repo: Repository, now: float | None = None) -> dict[str, list[str]]:
        """Map each kept version id to the reasons it is kept."""
        now = time.time() if now is None else now
        history = repo.history()  # newest first
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
            scored = [(repo.manifest(v).metrics.get(metric), v) for v in history]
            scored = [(float(s), v) for s, v in scored
                      if isinstance(s, (int, float)) and not isinstance(s, bool) and s == s]
            scored.sort(key=lambda x: x[0], reverse=direction == "max")
            for _, vid in scored[:count]:
                keep(vid, f"best {count} by {metric}")
        if self.keep_every:
            buckets: dict[int, str] = {}
            for vid in reversed(history):  # oldest first: the first version in each bucket
                step = repo.manifest(vid).step
                if step is not None:
                    buckets.setdefault(step // self.keep_every, vid)
            for vid in buckets.values():
                keep(vid, f"every {self.keep_every} steps")
        if self.keep_within is not None:
            for vid in history:
                if now - repo.manifest(vid).time <= self.keep_within:
                    keep(vid, f"within {self.keep_within:g}s")
        if self.keep_tags:
            for name, vid in repo.tags().items():
                keep(vid, f"tag {name}")
        return kept
