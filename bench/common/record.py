"""The data behind the committed reports: one JSON per study in bench/results/, named after the
study (``python -m bench training_slowdown --record KEY`` -> results/training_slowdown.json), one
entry per cited run under a key the reports name.  A run with ``--record KEY`` writes (or
refreshes) its entry; the others stay.  ``folder`` puts the JSON elsewhere (a quick run records
into its scratch folder, so that CI exercises the writer without touching bench/results/)."""

from __future__ import annotations

import json
import os
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def path(study: str, folder: str | None = None) -> str:
    """The JSON of ``study``'s recorded runs (``"guard_recovery"`` -> results/guard_recovery.json)."""
    return os.path.join(folder or RESULTS, f"{study}.json")


def load(study: str, folder: str | None = None) -> dict[str, Any]:
    """Every run recorded for ``study`` ({} before the first)."""
    try:
        with open(path(study, folder)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def recorded(study: str, key: str, folder: str | None = None) -> Any:
    """One recorded run; names the keys there are when ``key`` is not one of them."""
    runs = load(study, folder)
    if key not in runs:
        raise SystemExit(f"{path(study, folder)} has no run {key!r}; it has: {', '.join(sorted(runs))}")
    return runs[key]


def record(study: str, key: str, data: Any, folder: str | None = None) -> str:
    """Store ``data`` as run ``key`` of ``study``'s JSON (replacing a run of that key), atomically:
    an interrupted write leaves the previous file whole."""
    runs = load(study, folder)
    runs[key] = data
    target = path(study, folder)
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
