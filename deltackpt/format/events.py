"""Event records: what happened to a run besides its versions (a divergence guard's rollback, a
rollback drill), one small immutable file each (spec/FORMAT.md, "Event records").

    event = MAGIC(8) || msgpack map;  event id = xxh3-128 hex of the whole file

A reader treats every record as hostile input: the size is bounded before parsing, msgpack is
bounded by the record's own length, every known field is type- and range-checked, unknown fields
are dropped and an unknown ``kind`` keeps only the common fields.  A record that fails raises
:class:`~deltackpt.errors.CorruptObjectError` naming it; callers list it as damaged and go on with
the others.

Example::

    data = encode({"kind": "drill", "time": 1767225600.0, "version": "ab" * 16, "ok": True})
    event = decode(data, event_id=hex_id(data))
    assert event.kind == "drill" and event.data["ok"] is True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import CorruptObjectError, FormatVersionError
from . import msgpack_io
from .ids import ID_HEX_LEN, hex_id, is_hex_prefix
from .limits import EVENT_MAX_TEXT, EVENT_MAX_VALUES, EVENT_MAX_VERSIONS, MAX_EVENT_BYTES

MAGIC = b"DCKEVT\x01\x00"
ROLLBACK, DRILL = "rollback", "drill"
INT64 = (-(1 << 63), (1 << 63) - 1)

Check = Callable[[Any, str], Any]


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str) or len(v) > EVENT_MAX_TEXT:
        raise CorruptObjectError(f"{what}: expected text of at most {EVENT_MAX_TEXT} characters, got {v!r:.60}")
    return v


def _int(v: Any, what: str) -> int:
    return msgpack_io.expect_int(v, what, *INT64)


def _count(v: Any, what: str) -> int:
    return msgpack_io.expect_int(v, what, 0, INT64[1])


def _float(v: Any, what: str) -> float:
    """Any float, NaN and infinities included (a value that fired may be one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CorruptObjectError(f"{what}: expected a number, got {v!r:.60}")
    return float(v)


def _seconds(v: Any, what: str) -> float:
    """Finite and >= 0: interval policies compute with measured restore times."""
    x = _float(v, what)
    if not (math.isfinite(x) and x >= 0):
        raise CorruptObjectError(f"{what}: expected a finite number of seconds >= 0, got {v!r:.60}")
    return x


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise CorruptObjectError(f"{what}: expected true or false, got {v!r:.60}")
    return v


def _vid(v: Any, what: str) -> str:
    if not isinstance(v, str) or len(v) != ID_HEX_LEN or not is_hex_prefix(v):
        raise CorruptObjectError(f"{what}: expected a 32-character version id, got {v!r:.60}")
    return v


def _vids(v: Any, what: str) -> list[str]:
    if not isinstance(v, list) or len(v) > EVENT_MAX_VERSIONS:
        raise CorruptObjectError(f"{what}: expected at most {EVENT_MAX_VERSIONS} version ids")
    return [_vid(x, f"{what}[{i}]") for i, x in enumerate(v)]


def _values(v: Any, what: str) -> list[list]:
    if not isinstance(v, list) or len(v) > EVENT_MAX_VALUES:
        raise CorruptObjectError(f"{what}: expected at most {EVENT_MAX_VALUES} [step, value] pairs")
    out = []
    for i, pair in enumerate(v):
        if not isinstance(pair, list) or len(pair) != 2:
            raise CorruptObjectError(f"{what}[{i}]: expected [step, value]")
        out.append([_int(pair[0], f"{what}[{i}] step"), _float(pair[1], f"{what}[{i}] value")])
    return out


def _position(v: Any, what: str) -> list[list[int]]:
    """A sampler window: [[epoch, index], [epoch, index]], from (inclusive) and to (exclusive)."""
    if not isinstance(v, list) or len(v) != 2:
        raise CorruptObjectError(f"{what}: expected [[epoch, index], [epoch, index]]")
    out = []
    for i, p in enumerate(v):
        if not isinstance(p, list) or len(p) != 2:
            raise CorruptObjectError(f"{what}[{i}]: expected [epoch, index]")
        out.append([_count(p[0], f"{what}[{i}] epoch"), _count(p[1], f"{what}[{i}] index")])
    return out


def _optional(check: Check) -> Check:
    return lambda v, what: None if v is None else check(v, what)


# every field a reader knows, in the order writers write them; "kind" and "time" are required
COMMON: dict[str, Check] = {
    "kind": _text, "time": _float, "host": _text, "pid": _int, "run": _text, "version": _optional(_vid),
    "step": _optional(_int), "seconds": _optional(_seconds), "bytes_read": _optional(_count),
}
BY_KIND: dict[str, dict[str, Check]] = {
    ROLLBACK: {
        "metric": _text, "rule": _text, "value": _float, "threshold": _optional(_float),
        "baseline": _optional(_float), "values": _values, "bad_start": _int, "to_step": _optional(_int),
        "abandoned": _vids, "committed": _optional(_vid), "data": _text, "skipped": _optional(_position),
        "lr_scale": _optional(_float), "count": _count, "commit_seconds": _optional(_seconds),
    },
    DRILL: {
        "revision": _text, "ok": _bool, "logical_bytes": _count, "chunks": _count,
        "cpu_seconds": _optional(_seconds), "error": _optional(_text),
    },
}
REQUIRED: dict[str, tuple[str, ...]] = {
    ROLLBACK: ("version", "step", "metric", "rule", "bad_start"),
    DRILL: ("version", "ok", "seconds"),
}


@dataclass(frozen=True)
class Event:
    """One parsed event record: ``kind``, ``time`` and every known field in ``data``.

    ``Event.id`` names its file (``events/<id>``); ``data`` holds the common fields (``host``,
    ``pid``, ``run``, ``version``, ``step``, ``seconds``, ``bytes_read``) and the kind's own."""

    id: str
    kind: str
    time: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """``{"id", "kind", "time", "data"}``, ``data`` the same nested dict as :attr:`data`
        (what ``deltackpt events --json`` prints)."""
        return {"id": self.id, "kind": self.kind, "time": self.time if math.isfinite(self.time) else None,
                "data": dict(self.data)}


def encode(record: dict[str, Any]) -> bytes:
    """The bytes of a record (fields in the spec's order, ``None`` ones left out); refused with
    CorruptObjectError when a reader would refuse it, so nothing unreadable is ever written."""
    # (an unknown or missing kind has no fields of its own: .get with None is fine at run time)
    schema = {**COMMON, **BY_KIND.get(record.get("kind"), {})}  # type: ignore[arg-type]
    unknown = set(record) - set(schema)
    if unknown:
        raise CorruptObjectError(f"event record: unknown fields {sorted(unknown)}")
    ordered = {k: record[k] for k in schema if record.get(k) is not None}
    data = MAGIC + msgpack_io.pack(ordered)
    decode(data, event_id=hex_id(data))
    return data


def decode(data: bytes, *, event_id: str) -> Event:
    """Parse and check one record; ``event_id``: its file name, which must be the hash of ``data``."""
    what = f"event {event_id}"
    if len(data) > MAX_EVENT_BYTES:
        raise CorruptObjectError(f"{what}: {len(data)} bytes exceeds the limit of {MAX_EVENT_BYTES}")
    if hex_id(data) != event_id:
        raise CorruptObjectError(f"{what}: bytes do not hash to the record's name (damaged)")
    if len(data) < len(MAGIC) or data[:6] != MAGIC[:6]:
        raise CorruptObjectError(f"{what}: bad magic (not an event record)")
    if data[6:8] != MAGIC[6:8]:
        raise FormatVersionError(f"{what}: record version {data[6]} is newer than this reader's {MAGIC[6]}")
    obj = msgpack_io.unpack(data[len(MAGIC):], what=what, max_bytes=MAX_EVENT_BYTES)
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise CorruptObjectError(f"{what}: not a map of named fields")
    kind = _text(obj.get("kind"), f"{what} kind")
    if "time" not in obj:
        raise CorruptObjectError(f"{what}: no time")
    schema = {**COMMON, **BY_KIND.get(kind, {})}
    missing = [k for k in REQUIRED.get(kind, ()) if obj.get(k) is None]
    if missing:
        raise CorruptObjectError(f"{what}: a {kind} record without {', '.join(missing)}")
    fields = {k: check(obj[k], f"{what} {k}") for k, check in schema.items() if k in obj}
    return Event(event_id, kind, fields["time"], fields)
