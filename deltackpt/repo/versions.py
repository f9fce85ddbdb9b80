"""What ``log`` and ``show`` report about a version."""

from __future__ import annotations

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
    written_bytes: int = 0

    @property
    def short_id(self) -> str:
        return self.id[:10]

    def __str__(self) -> str:
        return self.short_id

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "short_id": self.short_id, "parent": self.parent, "time": self.time,
                "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time)), "step": self.step,
                "metrics": self.metrics, "meta": self.meta, "tags": list(self.tags), "exact": self.exact,
                "logical_bytes": self.logical_bytes, "written_bytes": self.written_bytes}
