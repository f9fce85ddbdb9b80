"""What a divergence guard's rollback leaves for people and tools: the :class:`Rollback` it
returns, the one line it logs, the ``meta`` of the version it commits (``deltackpt log`` labels
that version with it) and the event record it writes (spec/FORMAT.md, "Event records").

Example::

    line = message(rb, "ckpt", max_rollbacks=3, window=1000)
    # deltackpt: rollback at step 33: loss=nan (nonfinite), bad since step 33; restored version ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ..format.events import ROLLBACK
from ..format.limits import EVENT_MAX_TEXT, EVENT_MAX_VALUES, EVENT_MAX_VERSIONS
from ..api import internal
from ..api.internal import Version
from .detect import Verdict


@dataclass
class Rollback:
    """What a guard did when it fired.  ``step`` is the step the restored state is at: a loop
    that counts its own steps continues from it, with a new data iterator (the sampler moved).

    ``from_step``: the step the guard fired at; ``bad_start``: where it estimated the bad stretch
    began (the target's step is below ``bad_start - margin``); ``skipped``: the sampler window
    skipped, as two positions ``[[epoch, index], [epoch, index]]`` (from, inclusive, to,
    exclusive: ``skipped[1][1] - skipped[0][1]`` items when both are in one epoch), or None
    without a sampler or with ``data`` other than ``"skip"``; ``committed``: the version the
    restored state was saved as; ``message``: the line logged; ``seen_on``: under
    torch.distributed, the rank whose values fired (None in a single process)."""

    verdict: Verdict
    from_step: int
    bad_start: int
    version: Version
    step: int
    data: str
    skipped: list[list[int]] | None
    lr_scale: float | None
    bytes_read: int
    metadata_bytes: int
    seconds: float
    abandoned: list[str]
    count: int
    extra: Any = None
    committed: Version | None = None
    commit_seconds: float | None = None
    event: str | None = None
    tried: list[str] = field(default_factory=list)
    message: str = ""
    seen_on: int | None = None



def message(rb: Rollback, location: str, max_rollbacks: int, window: int) -> str:
    """The one line logged: what fired, where the bad stretch began, where the run went back to."""
    v = rb.verdict
    bound = "" if v.threshold is None else f", threshold {v.threshold:.4g}"
    rank = "" if rb.seen_on is None else f" on rank {rb.seen_on}"
    lr = "" if rb.lr_scale is None else f", lr x{rb.lr_scale:g}"
    return (f"deltackpt: rollback at step {rb.from_step}: {v.metric}={v.value:.4g} ({v.rule}{bound}){rank}, "
            f"bad since step {rb.bad_start}; restored version {rb.version.id[:10]} of step {rb.step} from "
            f"{location} (data {rb.data}{lr}; rollback {rb.count} of {max_rollbacks} allowed within {window} steps)")


def meta(rb: Rollback) -> dict[str, Any]:
    """The ``meta`` of the version a rollback commits."""
    v = rb.verdict
    return {"rollback": {"to": rb.version.id, "to_step": rb.step, "at_step": rb.from_step,
                         "bad_start": rb.bad_start, "metric": v.metric[:EVENT_MAX_TEXT], "rule": v.rule}}


def record(rb: Rollback, run: str, values: Iterable[tuple[int, float]]) -> dict[str, Any]:
    """The event record of a rollback; ``values``: the series' recent ``(step, value)`` pairs."""
    v = rb.verdict
    return {**internal.stamp(ROLLBACK), "run": run, "version": rb.version.id, "step": rb.from_step,
            "seconds": rb.seconds, "bytes_read": rb.bytes_read, "metric": v.metric[:EVENT_MAX_TEXT],
            "rule": v.rule, "value": v.value, "threshold": v.threshold, "baseline": v.baseline,
            "values": [[s, x] for s, x in list(values)[-EVENT_MAX_VALUES:]], "bad_start": rb.bad_start,
            "to_step": rb.step, "abandoned": rb.abandoned[:EVENT_MAX_VERSIONS],
            "committed": rb.committed.id if rb.committed else None, "data": rb.data, "skipped": rb.skipped,
            "lr_scale": rb.lr_scale, "count": rb.count, "commit_seconds": rb.commit_seconds}
