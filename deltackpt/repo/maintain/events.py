"""Event records in a repository: write one, list them all (a damaged one never hides the
others), and the questions the training side asks of them: the last drill, the versions a
rollback abandoned.  Byte layout: :mod:`deltackpt.format.events`; rules: spec/FORMAT.md, "Event
records".

Example::

    eid = write(core, {"kind": "drill", "time": time.time(), "version": vid, "ok": True, "seconds": 0.4})
    assert last(core, "drill").id == eid
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any

from ...errors import DeltackptError, ObjectNotFoundError
from ...format import events as events_fmt
from ...format.events import Event
from ...format.ids import ID_HEX_LEN, hex_id, is_hex_prefix
from ...format.limits import MAX_EVENT_BYTES
from ..layout import EVENTS
from ..repository import Repository

#: drill records gc keeps (the newest); rollback records are rare and all kept
KEEP_DRILLS = 16


def stamp(kind: str) -> dict[str, Any]:
    """The common fields of a record this process writes now."""
    return {"kind": kind, "time": time.time(), "host": socket.gethostname()[:255], "pid": os.getpid()}


def write(core: Repository, record: dict[str, Any]) -> str:
    """Write one record (create-if-absent: identical bytes are the same event); returns its id."""
    data = events_fmt.encode(record)
    eid = hex_id(data)
    core.store.put_if_absent(EVENTS + eid, data, site="event")
    return eid


def event_ids(core: Repository) -> list[str]:
    """Names under ``events/`` that are 32 lowercase hex characters (other names are ignored)."""
    names = (key[len(EVENTS):] for key in core.store.list(EVENTS))
    return [n for n in names if len(n) == ID_HEX_LEN and is_hex_prefix(n)]


def read(core: Repository, eid: str) -> Event:
    try:
        data = core.store.get_bounded(EVENTS + eid, MAX_EVENT_BYTES)
    except (ObjectNotFoundError, FileNotFoundError):
        raise ObjectNotFoundError(f"event {eid} is not in {core.location}") from None
    return events_fmt.decode(data, event_id=eid)


def scan(core: Repository) -> "list[tuple[str, Event | DeltackptError]]":
    """Every record, newest first, or the typed error that makes it unusable (placed by its
    file's modification time, the only date it still has)."""
    rows: list[tuple[float, str, Event | DeltackptError]] = []
    for eid in event_ids(core):
        try:
            e: Event | DeltackptError = read(core, eid)
            t = e.time  # type: ignore[union-attr]  # (read returned: an Event; the except stores an error)
        except DeltackptError as exc:
            e = exc
            try:
                t = core.store.mtime(EVENTS + eid)
            except (DeltackptError, OSError):
                t = -math.inf
        rows.append((t if t == t else -math.inf, eid, e))
    rows.sort(key=lambda r: (r[0], r[1]), reverse=True)
    return [(eid, e) for _t, eid, e in rows]


def usable(core: Repository, kind: str | None = None) -> list[Event]:
    """The records that parse, newest first (of ``kind`` when given)."""
    return [e for _eid, e in scan(core) if isinstance(e, Event) and (kind is None or e.kind == kind)]


def last(core: Repository, kind: str) -> Event | None:
    found = usable(core, kind)
    return found[0] if found else None


def abandoned(core: Repository) -> set[str]:
    """Every version a rollback turned away from (saved during a bad stretch, or after the
    version it went back to): never the target of a later rollback, in any run."""
    return {v for e in usable(core, events_fmt.ROLLBACK) for v in e.data.get("abandoned", [])}


def prune(core: Repository, *, dry_run: bool = False, keep_drills: int = KEEP_DRILLS) -> int:
    """Delete drill records beyond the newest ``keep_drills`` (gc's step for events); records that
    do not parse, and every other kind, stay (verify names the damaged ones).  Returns the count."""
    drills = usable(core, events_fmt.DRILL)
    doomed = drills[keep_drills:]
    if not dry_run:
        for e in doomed:
            core.store.delete(EVENTS + e.id, site="gc.event")
    return len(doomed)
