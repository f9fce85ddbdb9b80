"""Item 5 of issue 5: gc racing a save.  The saver freezes itself (SIGSTOP, fault action ``stop``) at a
chosen step, gc runs, the saver resumes (SIGCONT).  Protocol: tests/RELIABILITY.md, "Locks"."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import oracle, record, wait_for
from tests.conftest import proc_state

pytestmark = pytest.mark.reliability


def _template(zygote, path: str):
    c = zygote.run("save", path, steps=3)
    assert "DONE" in c.lines(), c.text()
    return c


# (where the saver freezes, what it saves): "fresh" = a new state (new chunks), "dedup" = the
# state of the oldest version, every chunk reused from a version this gc removes
POINTS = [
    ("pack.write:2", "fresh"),       # after its first chunk
    ("pack.fsync:1", "fresh"),       # after all its chunks
    ("index.write:1", "fresh"),      # pack committed, index not
    ("ref.write:1", "fresh"),        # after its manifest
    ("ref.rename:1", "fresh"),       # just before its ref moves
    ("lock.refs.write:1", "dedup"),  # all chunks deduplicated against a version gc is removing
    ("ref.rename:1", "dedup"),
]


@pytest.mark.parametrize("site,kind", POINTS)
def test_gc_while_save_is_frozen(zygote, tmp_path, site, kind):
    """gc started while a save is frozen mid-way waits for it (shared save lock, exclusive gc lock) and
    then keeps what it committed: the new version restores, even when it reuses chunks of a removed one."""
    t0 = time.monotonic()
    path = str(tmp_path / "r")
    tmpl = _template(zygote, path)
    job = {"steps": 1, "start": 0, "seed": 0, "offset": 100} if kind == "dedup" else {"steps": 1, "start": 5, "seed": 3}
    saver = zygote.start("save", path, fault=f"{site}:stop", **job)
    wait_for(lambda: proc_state(saver.pid) == "T", 30, f"saver to freeze at {site}")
    gc = zygote.start("gc", path, keep_last=1, grace=0)
    time.sleep(0.3)
    assert not gc.done.is_set(), f"gc finished while a save was frozen at {site}: {gc.text()}"
    os.kill(saver.pid, signal.SIGCONT)
    zygote.wait(saver, 60)
    zygote.wait(gc, 60)
    assert "DONE" in saver.lines(), saver.text()
    assert any(ln.startswith("GC ") for ln in gc.lines()), gc.text()
    (vid, d), = saver.committed()
    expected = {**tmpl.attempts(), **{s: x for s, x in saver.attempts().items()}}
    oracle(path, expected=expected, committed=[(vid, d)], must_exist={vid})
    record(f"gc-race-{site}-{kind}", points=1, lost=0, seconds=round(time.monotonic() - t0, 1))


def test_save_while_gc_is_frozen(zygote, tmp_path):
    """A save started while gc is frozen after deciding what is live waits for gc's exclusive lock, then
    commits a version that restores (its dedup sees gc's result, not the chunks gc deleted)."""
    path = str(tmp_path / "r")
    tmpl = _template(zygote, path)
    gc = zygote.start("gc", path, keep_last=1, grace=0, fault="gc.mark:1:stop")
    wait_for(lambda: proc_state(gc.pid) == "T", 30, "gc to freeze")
    saver = zygote.start("save", path, steps=1, start=0, seed=0, offset=100)
    time.sleep(0.3)
    assert not saver.done.is_set(), f"save finished while gc held the repository: {saver.text()}"
    os.kill(gc.pid, signal.SIGCONT)
    zygote.wait(gc, 60)
    zygote.wait(saver, 60)
    assert "DONE" in saver.lines(), saver.text()
    (vid, d), = saver.committed()
    oracle(path, expected={**tmpl.attempts(), 100: d}, committed=[(vid, d)], must_exist={vid})


def _versions(path: str) -> tuple[dict[str, str], set[str]]:
    from deltackpt.repo.repository import Repository
    core = Repository(path)
    return core.tags(), set(core.version_ids())


def test_tag_while_gc_is_frozen_after_planning_keeps_the_version(zygote, tmp_path):
    """A tag set on a version gc has planned to remove (gc frozen at ``gc.mark``) succeeds, and gc then
    keeps that version: it re-reads the tags under the refs lock and plans again (no dangling tag)."""
    path = str(tmp_path / "r")
    tmpl = _template(zygote, path)
    (oldest, d0), *_ = tmpl.committed()
    gc = zygote.start("gc", path, keep_last=1, grace=0, fault="gc.mark:1:stop")
    wait_for(lambda: proc_state(gc.pid) == "T", 30, "gc to freeze")
    tag = zygote.run("tag", path, name="keep", version=oldest)
    assert tag.exit_code == 0 and f"TAGGED keep {oldest}" in tag.lines(), tag.text()
    os.kill(gc.pid, signal.SIGCONT)
    zygote.wait(gc, 60)
    assert gc.exit_code == 0, gc.text()
    tags, versions = _versions(path)
    assert tags == {"keep": oldest} and oldest in versions, f"gc deleted the version tagged during its run: {tags}"
    oracle(path, expected=tmpl.attempts(), committed=[(oldest, d0)], must_exist={oldest})
    record("tag-vs-gc-planned", points=1, lost=0, dangling=0)


def test_tag_resolved_before_gc_deleted_the_version_fails_typed(zygote, tmp_path):
    """A tag that resolved its version before gc removed it, and reaches the refs lock after, fails with
    UnknownVersionError and writes no tag (it never names a deleted version)."""
    path = str(tmp_path / "r")
    tmpl = _template(zygote, path)
    (oldest, _d0), *_ = tmpl.committed()
    tag = zygote.start("tag", path, name="late", version=oldest, fault="lock.refs.write:1:stop")
    wait_for(lambda: proc_state(tag.pid) == "T", 30, "tag to freeze before the refs lock")
    gc = zygote.run("gc", path, keep_last=1, grace=600)  # (grace 0 would delete the frozen tag's temp file)
    assert gc.exit_code == 0 and any(ln.startswith("GC ") for ln in gc.lines()), gc.text()
    os.kill(tag.pid, signal.SIGCONT)
    zygote.wait(tag, 60)
    tags, versions = _versions(path)
    assert oldest not in versions, "gc kept the version (the race did not happen)"
    assert tags == {}, f"dangling tag {tags} naming a version gc deleted"
    assert "ERROR UnknownVersionError" in tag.text() and "TAGGED" not in tag.text(), tag.text()
    oracle(path, expected=tmpl.attempts(), committed=tmpl.committed()[-1:])
    record("tag-vs-gc-deleted", points=1, lost=0, dangling=0)
