"""Holds (locks/hold-*): gc keeps the versions a live process holds, whatever the retention rules
say; a dead holder's hold keeps nothing and gc deletes it; a hold on a version gc already removed
reports that it holds nothing; a malformed hold body holds nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import deltackpt
from deltackpt.format import msgpack_io
from deltackpt.repo import lock_holders, locks
from deltackpt.repo.maintain import holds
from tests.conftest import ROOT

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid") or lock_holders.BOOT is None,
                                reason="needs Linux /proc (pid namespaces, boot id)")


def _versions(repo_path: str, n: int = 3) -> list[str]:
    return [deltackpt.save({"w": torch.full((64,), float(i))}, repo_path, step=i).id for i in range(n)]


def _ids(repo_path: str) -> set[str]:
    return {v.id for v in deltackpt.Repo(repo_path).log()}


def test_a_hold_keeps_a_version_until_released(repo_path):
    vids = _versions(repo_path)
    core = deltackpt.Repo(repo_path).core
    hold = holds.Hold(core.store)
    assert hold.set([vids[0]]) == [vids[0]]
    report = deltackpt.gc(repo_path, keep_last=1)
    assert report.removed == [vids[1]] and report.kept[vids[0]][0].startswith("held by pid")
    assert deltackpt.gc(repo_path, keep_last=1, keep_tags=False).removed == []
    hold.release()
    assert not [k for k in core.store.list("locks/") if k.startswith(holds.HOLDS)]
    assert deltackpt.gc(repo_path, keep_last=1).removed == [vids[0]]
    assert _ids(repo_path) == {vids[2]}


def test_holding_a_version_gc_removed_holds_nothing(repo_path):
    vids = _versions(repo_path)
    deltackpt.gc(repo_path, keep_last=1)
    hold = holds.Hold(deltackpt.Repo(repo_path).core.store)
    assert hold.set([vids[0], vids[2]]) == [vids[2]]
    assert hold.versions == [vids[2]]
    hold.release()


@needs_proc
def test_a_dead_holders_hold_keeps_nothing(repo_path):
    """A real process takes a hold and is SIGKILLed: gc judges it dead (same host, pid namespace
    and boot), removes the version and deletes the hold file; a dry run only reads."""
    vids = _versions(repo_path)
    code = textwrap.dedent(f"""
        import sys, time, deltackpt
        from deltackpt.repo.maintain import holds
        holds.Hold(deltackpt.Repo({repo_path!r}).core.store).set([{vids[0]!r}])
        print("held", flush=True)
        time.sleep(120)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"held"
        assert vids[0] in holds.held(deltackpt.Repo(repo_path).core.store)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    store = deltackpt.Repo(repo_path).core.store
    assert holds.held(store) == {}
    assert sorted(deltackpt.gc(repo_path, keep_last=1, dry_run=True).removed) == sorted(vids[:2])
    assert [k for k in store.list("locks/") if k.startswith(holds.HOLDS)]
    deltackpt.gc(repo_path, keep_last=1)
    assert _ids(repo_path) == {vids[2]}
    assert not [k for k in store.list("locks/") if k.startswith(holds.HOLDS)]


@pytest.mark.parametrize("versions", [["../x"], ["AB" * 16], "ab" * 16, [1, 2], ["ab" * 16] * (holds.MAX_HELD + 1)])
def test_a_malformed_hold_holds_nothing(repo_path, versions):
    vids = _versions(repo_path, 2)
    store = deltackpt.Repo(repo_path).core.store
    body = msgpack_io.unpack(locks._body("hold"), what="x", max_bytes=4096)
    store.put_atomic(f"{holds.HOLDS}planted-1-00000000", msgpack_io.pack({**body, "versions": versions}))
    store.put_atomic(f"{holds.HOLDS}torn-1-00000000", b"\x93\x01")
    assert holds.held(store) == {}
    assert deltackpt.gc(repo_path, keep_last=1).removed == [vids[0]]
    # the planted body names this live process: kept, holding nothing; the torn one names nobody,
    # and no live holder's body is ever torn (spec §13), so gc breaks it
    assert [k for k in store.list("locks/") if k.startswith(holds.HOLDS)] == [f"{holds.HOLDS}planted-1-00000000"]


def test_a_hold_is_renewed_and_survives_its_lease_while_alive(repo_path, monkeypatch):
    """A hold is a lock body: an old file whose holder this process is keeps its versions only
    within the lease; the holder rewrites it (renewal) so that never runs out while it lives."""
    vids = _versions(repo_path, 2)
    store = deltackpt.Repo(repo_path).core.store
    monkeypatch.setattr(locks, "RENEW_SECONDS", 0.05)
    hold = holds.Hold(store)
    hold.set([vids[0]])
    first = store.mtime(hold.key)
    time.sleep(0.3)
    assert store.mtime(hold.key) > first
    hold.release()
