"""What ``log`` and ``show`` report about a version."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Version:
    """One saved version.  ``str(v)`` is its short id.

    Example::

        v = deltackpt.save(model, "ckpt", step=100)
        print(v.id, v.step, v.tags)
    """

    id: str
    parent: str | None
    time: float
    step: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    meta: Any = None
    tags: tuple[str, ...] = ()
    exact: bool = True
    logical_bytes: int = 0
    written_bytes: int | None = 0
    """Bytes the save wrote (from the manifest's ``extra``); None when the writer's figure is
    missing a usable value (readers do not need it, so an odd one is shown as unknown)."""
    error: str | None = None
    """Why this version's manifest cannot be used (set only by ``Repo.log``, which lists a damaged
    version instead of failing); every other field is then a placeholder."""

    @classmethod
    def damaged(cls, vid: str, error: str, tags: tuple[str, ...] = ()) -> "Version":
        """A listing row for a version whose manifest does not parse."""
        return cls(id=vid, parent=None, time=math.nan, tags=tags, exact=False, written_bytes=None, error=error)

    @property
    def short_id(self) -> str:
        return self.id[:10]

    def __str__(self) -> str:
        return self.short_id

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "short_id": self.short_id, "parent": self.parent,
                "time": self.time if math.isfinite(self.time) else None, "time_iso": iso_time(self.time),
                "step": self.step, "metrics": self.metrics, "meta": self.meta, "tags": list(self.tags),
                "exact": self.exact, "logical_bytes": self.logical_bytes, "written_bytes": self.written_bytes,
                "error": self.error}


def iso_time(t: float) -> str | None:
    """UTC ISO text of a unix time; None for one no calendar holds (NaN, 1e20: a manifest's
    ``time`` is the writer's word, and listing must not fail on it)."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    except (ValueError, OverflowError, OSError):
        return None
