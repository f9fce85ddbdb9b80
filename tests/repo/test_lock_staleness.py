"""Stale-lock judgement (issue 16, item 2): a pid is judged only by a process in the holder's pid
namespace and boot; a lock that cannot be proven dead waits for its lease; a provably live holder
keeps its lock however long it runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from deltackpt.errors import RepositoryLockedError
from deltackpt.format import msgpack_io
from deltackpt.repo import lock_holders, locks
from deltackpt.store import LocalStore


def _dead_pid() -> int:
    """A pid that no process of this namespace has now (a child that ran and was reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _save_lock(store: LocalStore, name: str, **fields) -> str:
    body = {"host": locks.HOST, "time": time.time(), "kind": "save", "token": ""}
    body.update(fields)
    key = f"{locks.LOCKS}save-{name}"
    store.put_atomic(key, msgpack_io.pack(body))
    return key


def _gc_waits_for(store: LocalStore, key: str) -> None:
    with pytest.raises(RepositoryLockedError):
        with locks.gc_lock(store, timeout=0.3):
            pass
    assert store.exists(key), f"{key} was broken"
    assert not store.exists(locks.GC_LOCK)


def _ours() -> dict:
    return {"pidns": os.readlink("/proc/self/ns/pid"), "boot": lock_holders.BOOT}


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid") or lock_holders.BOOT is None,
                                reason="needs Linux /proc (pid namespaces, boot id)")


@needs_proc
@pytest.mark.parametrize("other", ["pidns", "boot"])
def test_lock_from_another_pid_namespace_or_boot_is_not_broken(tmp_path, other):
    """A save lock naming this host and a pid that is dead here, but written in another pid namespace
    (a sidecar container sharing the host name) or before a reboot, is not broken: gc waits."""
    store = LocalStore(tmp_path)
    fields = {**_ours(), "pid": _dead_pid()}
    fields[other] = "pid:[4026532999]" if other == "pidns" else "00000000-0000-0000-0000-000000000000"
    key = _save_lock(store, "sidecar", **fields)
    assert not locks.is_stale(store, key, locks._holder(store, key))
    _gc_waits_for(store, key)


def test_old_lock_body_without_namespace_waits_for_the_lease(tmp_path):
    """A lock body without namespace and boot (an older deltackpt) whose pid is dead here cannot be
    proven dead: it is kept until it is older than the lease, then broken."""
    store = LocalStore(tmp_path)
    key = _save_lock(store, "old", pid=_dead_pid())
    _gc_waits_for(store, key)
    old = time.time() - locks.STALE_SECONDS - 60
    os.utime(store._path(key), (old, old))
    with locks.gc_lock(store, timeout=5):
        assert not store.exists(key)


@needs_proc
def test_lock_of_a_dead_pid_in_our_namespace_is_broken_at_once(tmp_path):
    """A lock written in this pid namespace and boot by a process that is gone is broken at once."""
    store = LocalStore(tmp_path)
    key = _save_lock(store, "dead", pid=_dead_pid(), **_ours())
    with locks.gc_lock(store, timeout=5):
        assert not store.exists(key)


@needs_proc
def test_reused_pid_does_not_keep_a_dead_holders_lock(tmp_path):
    """A lock whose pid now belongs to a process that started after the holder (pid reuse) is broken."""
    store = LocalStore(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = lock_holders.start_time(other.pid)
        key = _save_lock(store, "reused", pid=other.pid, start=start - 1, **_ours())
        assert locks.is_stale(store, key, locks._holder(store, key))
        key = _save_lock(store, "live", pid=other.pid, start=start, **_ours())
        assert not locks.is_stale(store, key, locks._holder(store, key))
    finally:
        other.kill()
        other.wait()


@needs_proc
def test_provably_live_holder_keeps_its_lock_past_the_lease(tmp_path):
    """A save running longer than the lease keeps its lock while its process provably lives (the old
    rule broke any lock older than 6 h, and gc then deleted that save's chunks)."""
    store = LocalStore(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        key = _save_lock(store, "long", pid=other.pid, start=lock_holders.start_time(other.pid), **_ours())
        old = time.time() - locks.STALE_SECONDS - 3600
        os.utime(store._path(key), (old, old))
        _gc_waits_for(store, key)
    finally:
        other.kill()
        other.wait()


_IN_NS = textwrap.dedent("""
    import os, sys, time
    from deltackpt.repo import locks
    from deltackpt.store import LocalStore
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(int(sys.argv[2]) - 1))   # the next process of this namespace gets pid argv[2]
    pid = os.fork()
    if pid == 0:
        lease = locks.acquire_save(LocalStore(sys.argv[1]))
        print("HELD", os.getpid(), lease.key, flush=True)
        sys.stdin.read()                      # hold the lock until the test closes stdin
        lease.release()
        os._exit(0)
    os.waitpid(pid, 0)
""")


def _free_pid() -> int:
    for pid in range(31000, 1000, -7):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    pytest.skip("no free pid found")


@needs_proc
def test_real_second_pid_namespace_holder_is_not_broken(tmp_path):
    """A saver really running in another pid namespace (``unshare --pid``), whose pid there is a pid
    that is free in ours, keeps its save lock: gc here waits instead of judging it dead."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a pid namespace here: {probe.stderr.decode().strip()}")
    store = LocalStore(tmp_path)
    target = _free_pid()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _IN_NS,
                               str(tmp_path), str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = holder.stdout.readline().split()
        assert line and line[0] == "HELD", holder.stderr.read()
        pid, key = int(line[1]), line[2]
        assert pid == target and not os.path.exists(f"/proc/{pid}"), "the holder's pid is not free here"
        info = locks._holder(store, key)
        assert info["pidns"] != os.readlink("/proc/self/ns/pid")
        _gc_waits_for(store, key)
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert holder.returncode == 0, holder.stderr.read()
    assert not store.exists(key)


@pytest.mark.parametrize("kind", ["save", "gc"])
def test_held_lock_is_renewed_so_its_lease_never_runs_out(tmp_path, monkeypatch, kind):
    """A save or gc renews its lock (same body, fresh mtime) while it runs, so a process that cannot
    prove the holder alive (another host or pid namespace) never sees its lease expire mid-run."""
    monkeypatch.setattr(locks, "RENEW_SECONDS", 0.05)
    store = LocalStore(tmp_path)
    cm = locks.save_lock(store) if kind == "save" else locks.gc_lock(store)
    with cm:
        key = locks.GC_LOCK if kind == "gc" else store.list(locks.LOCKS)[0]
        body = store.get(key)
        old = time.time() - locks.STALE_SECONDS - 60
        os.utime(store._path(key), (old, old))
        deadline = time.monotonic() + 30
        while time.time() - store.mtime(key) > locks.STALE_SECONDS:
            assert time.monotonic() < deadline, "the lock was never renewed"
            time.sleep(0.02)
        assert store.get(key) == body, "renewal changed the holder's body"
    time.sleep(0.2)
    assert store.list(locks.LOCKS) == [], "a renewal re-created a released lock"


@pytest.mark.parametrize("body", [b"", b"\x93\x01"], ids=["empty", "torn"])
def test_an_empty_or_torn_save_lock_is_what_a_power_cut_left_and_is_broken_at_once(tmp_path, body):
    """Save locks are written without fsync: a power cut can leave one empty or torn.  No live
    holder's lock ever looks like that, so gc breaks it at once instead of waiting six hours."""
    store = LocalStore(str(tmp_path))
    key = f"{locks.LOCKS}save-crashed"
    store.put_atomic(key, body)
    t0 = time.monotonic()
    with locks.gc_lock(store, timeout=30):
        pass
    assert time.monotonic() - t0 < 10
    assert not store.exists(key)


@pytest.mark.parametrize("key", [locks.REFS_LOCK, locks.GC_LOCK])
def test_an_empty_refs_or_gc_lock_is_a_full_disks_and_waits_for_its_lease(tmp_path, key):
    """gc takes these two empty on a full disk (and writes them durably, so a power cut never
    empties them): an empty one names a holder nobody can judge, so it waits for the lease."""
    store = LocalStore(str(tmp_path))
    store.put_atomic(key, b"")
    assert not locks.is_stale(store, key, locks._holder(store, key))
    old = time.time() - locks.STALE_SECONDS - 60
    os.utime(os.path.join(str(tmp_path), key), (old, old))
    assert locks.is_stale(store, key, locks._holder(store, key))
