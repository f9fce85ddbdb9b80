"""Event records are hostile input: bounded, type-checked, typed errors naming the record; one
damaged record never hides the others; verify warns about it and gc neither deletes it nor fails."""

from __future__ import annotations

import math

import msgpack
import pytest
import torch

import deltackpt
from deltackpt.errors import CorruptObjectError, FormatVersionError
from deltackpt.format import events as events_fmt
from deltackpt.format.ids import hex_id
from deltackpt.format.limits import EVENT_MAX_VALUES, MAX_EVENT_BYTES
from deltackpt.repo.maintain import events
from deltackpt.repo.layout import EVENTS

VID = "ab" * 16
DRILL = {"kind": "drill", "time": 1.0, "version": VID, "ok": True, "seconds": 0.5}


def _raw(obj, magic=events_fmt.MAGIC) -> bytes:
    return magic + msgpack.packb(obj, use_bin_type=True)


def _decode(data: bytes):
    return events_fmt.decode(data, event_id=hex_id(data))


def test_round_trip_and_unknown_things():
    """Known fields round-trip; unknown fields are dropped; an unknown kind keeps its common fields."""
    e = _decode(events_fmt.encode(DRILL))
    assert (e.kind, e.data["ok"], e.data["seconds"]) == ("drill", True, 0.5)
    e = _decode(_raw({**DRILL, "future_field": [1, 2]}))
    assert "future_field" not in e.data
    e = _decode(_raw({"kind": "checkpoint-moved", "time": 2.0, "step": 7, "whatever": {"a": 1}}))
    assert e.kind == "checkpoint-moved" and e.data == {"kind": "checkpoint-moved", "time": 2.0, "step": 7}
    nan = _decode(events_fmt.encode({"kind": "rollback", "time": 1.0, "version": VID, "step": 3, "metric": "loss",
                                     "rule": "nonfinite", "value": math.nan, "bad_start": 3}))
    assert math.isnan(nan.data["value"])


@pytest.mark.parametrize("data,match", [
    (_raw(DRILL, b"DCKMAN\x01\x00"), "bad magic"),
    (_raw({**DRILL, "ok": 1}), "ok: expected true or false"),
    (_raw({**DRILL, "seconds": math.inf}), "finite number of seconds"),
    (_raw({**DRILL, "seconds": -1.0}), "finite number of seconds"),
    (_raw({**DRILL, "version": "../../x"}), "32-character version id"),
    (_raw({k: v for k, v in DRILL.items() if k != "ok"}), "without ok"),
    (_raw({"time": 1.0}), "kind: expected text"),
    (_raw({"kind": "drill"}), "no time"),
    (_raw([1, 2, 3]), "not a map"),
    (_raw({1: 2, "kind": "drill", "time": 1.0}), "not a map of named fields"),
    (_raw({"kind": "rollback", "time": 1.0, "version": VID, "step": 1, "metric": "l", "rule": "spike", "bad_start": 1,
           "values": [[i, 1.0] for i in range(EVENT_MAX_VALUES + 1)]}), "at most 64"),
    (_raw({**DRILL, "pid": (1 << 64) - 1}), "integer in"),
    (events_fmt.MAGIC + b"\xdf\xff\xff\xff\xff", "undecodable msgpack"),
    (_raw({**DRILL, "host": "x" * (MAX_EVENT_BYTES + 1)}), "exceeds the limit"),
])
def test_hostile_records_are_refused_typed(data, match):
    with pytest.raises(CorruptObjectError, match=match):
        _decode(data)


def test_a_newer_record_version_and_a_wrong_name():
    data = _raw(DRILL, b"DCKEVT\x02\x00")
    with pytest.raises(FormatVersionError, match="newer"):
        _decode(data)
    with pytest.raises(CorruptObjectError, match="do not hash"):
        events_fmt.decode(events_fmt.encode(DRILL), event_id="00" * 16)
    with pytest.raises(CorruptObjectError, match="unknown fields"):
        events_fmt.encode({**DRILL, "typo": 1})


def test_one_damaged_record_hides_nothing_and_verify_and_gc_cope(repo_path):
    """A torn record, a planted huge file and a stray name sit beside good records: scan lists the
    good ones and each damaged one with its error; verify warns (the repository stays ok); gc keeps
    the damaged files, prunes only old drill records and keeps every rollback record."""
    v = deltackpt.save({"w": torch.ones(4)}, repo_path, step=1)
    core = deltackpt.Repo(repo_path).core
    good = [events.write(core, {**DRILL, "version": v.id, "time": float(i)}) for i in range(events.KEEP_DRILLS + 3)]
    rollback = events.write(core, {"kind": "rollback", "time": 0.5, "version": v.id, "step": 2, "metric": "loss",
                                   "rule": "spike", "bad_start": 2, "abandoned": ["cd" * 16]})
    torn = events_fmt.encode({**DRILL, "version": v.id, "time": 99.0})
    core.store.put_atomic(EVENTS + hex_id(torn), torn[:-3])
    core.store.put_atomic(EVENTS + "11" * 16, b"\x00" * (MAX_EVENT_BYTES + 1))
    core.store.put_atomic(EVENTS + "README", b"not a record")
    rows = events.scan(core)
    damaged = [eid for eid, e in rows if isinstance(e, Exception)]
    assert sorted(damaged) == sorted([hex_id(torn), "11" * 16])
    assert {eid for eid, e in rows if not isinstance(e, Exception)} == {*good, rollback}
    assert events.abandoned(core) == {"cd" * 16}
    assert [e.kind for e in deltackpt.Repo(repo_path).events()].count("damaged") == 2

    report = deltackpt.Repo(repo_path).verify()
    assert report.ok and sorted(p.object for p in report.warnings) == sorted(EVENTS + d for d in damaged)
    assert deltackpt.gc(repo_path, dry_run=True).events_deleted == 3
    assert deltackpt.gc(repo_path, keep_last=1).events_deleted == 3
    left = set(events.event_ids(core))
    assert left == {*good[3:], rollback, *damaged}
    assert core.store.exists(EVENTS + "README")
