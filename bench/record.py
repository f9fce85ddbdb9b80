"""The data behind each committed report: one JSON per report in bench/results/, named after it
(ASYNC.md -> async.json, DELTAS.md -> deltas.json), one entry per cited run under a key the report
names.  A script run with ``--record KEY`` writes (or refreshes) its entry; the others stay."""

from __future__ import annotations

import json
import os
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def path(report: str) -> str:
    """The JSON that backs ``report`` (``"async"`` for ASYNC.md)."""
    return os.path.join(RESULTS, f"{report.lower()}.json")


def load(report: str) -> dict[str, Any]:
    """Every run recorded for ``report`` ({} before the first)."""
    try:
        with open(path(report)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def recorded(report: str, key: str) -> Any:
    """One recorded run; names the keys there are when ``key`` is not one of them."""
    runs = load(report)
    if key not in runs:
        raise SystemExit(f"{path(report)} has no run {key!r}; it has: {', '.join(sorted(runs))}")
    return runs[key]


def record(report: str, key: str, data: Any) -> str:
    """Store ``data`` as run ``key`` of ``report``'s JSON (replacing a run of that key), atomically:
    an interrupted write leaves the previous file whole."""
    runs = load(report)
    runs[key] = data
    target = path(report)
    tmp = target + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(dict(sorted(runs.items())), f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
