"""Hostile lock bodies (issue 23 item 10): a lock naming a pid no process can have (2^31, which made
``os.kill`` raise OverflowError in every save while it sat in locks/gc) is judged dead, as spec §13
says of a pid that does not exist; a body whose other fields are of the wrong type or size
(``time: "soon"``, which exited 4 after the refs lock's 60 s) is described in one line, and judged
by its holder as any other."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import deltackpt
from deltackpt.cli import main as cli
from deltackpt.errors import RepositoryLockedError
from deltackpt.format import msgpack_io
from deltackpt.repo import lock_holders, locks
from deltackpt.store import LocalStore
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid") or lock_holders.BOOT is None,
                                reason="needs Linux /proc (pid namespaces, boot id)")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _plant(repo: str, key: str, **fields) -> None:
    """A lock body as this host, pid namespace and boot would write it, with ``fields`` replaced."""
    body = {"host": locks.HOST, "pid": _dead_pid(), "time": time.time(), "kind": key.rsplit("/", 1)[-1],
            "token": "t", "pidns": os.readlink("/proc/self/ns/pid"), "boot": lock_holders.BOOT, "start": None}
    body.update(fields)
    LocalStore(repo).put_atomic(key, msgpack_io.pack(body))


@pytest.fixture
def repo(repo_path):
    deltackpt.save({"w": torch.arange(8.0)}, repo_path, step=1)
    return repo_path


@pytest.mark.parametrize("key", [locks.GC_LOCK, locks.REFS_LOCK, locks.LOCKS + "save-x"])
def test_a_lock_naming_pid_2_to_the_31_is_judged_dead_and_saves_and_gc_go_on(repo, key):
    _plant(repo, key, pid=1 << 31)
    t0 = time.monotonic()
    v = deltackpt.save({"w": torch.zeros(8)}, repo, step=2)
    proc = run_cli("gc", "--repo", repo, "--keep-last", "1", "--json", check=False)
    assert proc.returncode == cli.EXIT_OK, proc.stderr
    assert time.monotonic() - t0 < 60   # no waiting for a lease or a lock timeout
    assert [x.id for x in deltackpt.Repo(repo).log()] == [v.id]


@pytest.mark.parametrize("pid", [1 << 31, (1 << 63) - 1, (1 << 64) - 1])
def test_impossible_pids_are_dead_not_an_overflow(repo, pid):
    _plant(repo, locks.GC_LOCK, pid=pid)
    store = LocalStore(repo)
    assert locks.is_stale(store, locks.GC_LOCK, locks._holder(store, locks.GC_LOCK))


ODD_TIMES = {"soon": "soon", "huge": 1e300, "nan": float("nan"), "map": {"a": 1}, "bool": True, "neg": -1e20}


@pytest.mark.parametrize("name", sorted(ODD_TIMES))
def test_a_lock_with_an_odd_time_and_a_dead_holder_is_broken_at_once(repo, name):
    """deltackpt tag (the refs lock) through the real CLI: the dead holder's lock is broken at once
    (a NaN time made the body unequal to itself, so the breaker never deleted it and tag spun forever)."""
    _plant(repo, locks.REFS_LOCK, time=ODD_TIMES[name])
    t0 = time.monotonic()
    proc = run_cli("tag", "good", "--repo", repo, check=False)
    assert proc.returncode == cli.EXIT_OK, proc.stderr
    assert time.monotonic() - t0 < 50


@pytest.mark.parametrize("name", sorted(ODD_TIMES))
def test_a_live_holder_with_odd_fields_is_named_in_one_typed_line(repo, name):
    """A live holder (a real process) whose body has an odd time and a huge multi-line host: waiting
    for it ends in one RepositoryLockedError line, not a TypeError from formatting its time."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _plant(repo, locks.REFS_LOCK, pid=holder.pid, time=ODD_TIMES[name])
        store = LocalStore(repo)
        with pytest.raises(RepositoryLockedError) as err:
            with locks.refs_lock(store, timeout=0.3):
                pass
        text = str(err.value)
        assert f"pid {holder.pid} on {locks.HOST}" in text and "\n" not in text
        assert "since an unknown time" in text
        LocalStore(repo).put_atomic(locks.REFS_LOCK, msgpack_io.pack(
            {"host": "h\n" * 1500, "pid": [1], "time": None}))
        with pytest.raises(RepositoryLockedError, match=r"pid \[1\] on h h h") as err:
            with locks.refs_lock(store, timeout=0.3):
                pass
        assert len(str(err.value)) < 300
    finally:
        holder.kill()
        holder.wait()
