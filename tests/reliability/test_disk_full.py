"""Item 7 of issue 5 on a real small filesystem: a 4 MiB tmpfs fills up during a save (the injected
ENOSPC / EIO at each site is in test_fault_sites.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
from harness import oracle, record

pytestmark = pytest.mark.reliability


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 4 MiB tmpfs here ({proc.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _files(path: str) -> dict[str, int]:
    out = {}
    for d, _, fs in os.walk(path):
        for f in fs:
            out[os.path.relpath(os.path.join(d, f), path)] = os.path.getsize(os.path.join(d, f))
    return out


def test_save_on_a_full_filesystem(small_fs):
    """When the filesystem fills mid-save the save raises StoreError saying the disk is full, the ref does
    not move, nothing partial sits under a final name, no temp is left, the older version restores, and
    after space is freed the same save succeeds."""
    import deltackpt
    import torch
    from child import state_digest
    from deltackpt.errors import StoreError
    from deltackpt.format.ids import hex_id
    repo = os.path.join(small_fs, "repo")
    torch.manual_seed(0)
    small = {"w": torch.randn(64, 64)}
    v1 = deltackpt.save(small, repo, step=1)
    filler = os.path.join(small_fs, "filler")
    with open(filler, "wb") as f:
        f.write(os.urandom(int(2.5 * (1 << 20))))
    big = {"w": torch.randn(64, 64), "big": torch.randn(512, 1024)}  # 2 MiB of incompressible floats
    before = _files(repo)
    with pytest.raises(StoreError) as err:
        deltackpt.save(big, repo, step=2)
    assert "disk full" in str(err.value), str(err.value)
    assert deltackpt.Repo(repo).resolve("latest").id == v1.id, "the ref moved on a failed save"
    after = _files(repo)
    for name in after:
        if name.startswith(("packs/", "index/", "manifests/")):
            with open(os.path.join(repo, name), "rb") as f:
                assert hex_id(f.read()) == os.path.basename(name), f"partial object {name}"
    assert not [n for n in after if n.startswith("tmp/")], f"temps left: {after}"
    assert {n for n in after if n.startswith(("manifests/", "refs/"))} == \
        {n for n in before if n.startswith(("manifests/", "refs/"))}, "a failed save left a manifest or ref"
    assert state_digest(deltackpt.load(repo, v1.id)) == state_digest(small)
    os.unlink(filler)
    v2 = deltackpt.save(big, repo, step=2)
    assert state_digest(deltackpt.load(repo, v2.id)) == state_digest(big)
    oracle(repo, expected={1: state_digest(small), 2: state_digest(big)},
           committed=[(v1.id, state_digest(small)), (v2.id, state_digest(big))])
    record("tmpfs-disk-full", points=1, lost=0, leaked_temps=0)


def _fill(path: str) -> None:
    """Fill the filesystem holding ``path`` to 100 % (a file written until ENOSPC)."""
    fd = os.open(os.path.join(path, "filler"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, b"\xff" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_gc_reclaims_space_on_a_full_filesystem(small_fs):
    """On a 100 % full filesystem gc still runs (its lock needs no free block, and it deletes what only
    removed versions used before it writes anything) and frees space; the kept version restores."""
    import deltackpt
    import torch
    from child import state_digest
    repo = os.path.join(small_fs, "repo")
    states = []
    for step in range(4):
        torch.manual_seed(step)
        states.append({"w": torch.randn(256, 256)})  # 256 KiB of incompressible floats each
        deltackpt.save(states[-1], repo, step=step)
    _fill(small_fs)
    assert os.statvfs(small_fs).f_bavail == 0
    rep = deltackpt.gc(repo, keep_last=1, grace_seconds=0)
    assert len(rep.removed) == 3 and rep.reclaimed_bytes > 0
    assert os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize >= 512 << 10, "gc freed no space"
    assert state_digest(deltackpt.load(repo, "latest")) == state_digest(states[-1])
    assert deltackpt.Repo(repo).verify().ok
    assert not os.listdir(os.path.join(repo, "locks")), "gc left a lock"
    record("tmpfs-full-gc", points=1, lost=0)


def _tree(path: str) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under ``path`` with (inode, mtime ns, size): any write shows."""
    out = {}
    for d, dirs, fs in os.walk(path):
        for name in [".", *dirs, *fs]:
            full = os.path.normpath(os.path.join(d, name))
            st = os.lstat(full)
            out[os.path.relpath(full, path)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def _three_versions(repo: str) -> None:
    import deltackpt
    import torch
    for step in range(3):
        torch.manual_seed(step)
        deltackpt.save({"w": torch.randn(128, 128)}, repo, step=step)


def test_gc_dry_run_writes_nothing(tmp_path):
    """``gc(dry_run=True)`` is a reader: it takes no lock and breaks none (here a dead saver's), so no
    file or folder of the repository changes, not even an mtime."""
    import deltackpt
    from deltackpt.format import msgpack_io
    from deltackpt.repo import locks
    repo = str(tmp_path / "r")
    _three_versions(repo)
    dead = subprocess.Popen(["true"])
    dead.wait()
    body = {"host": locks.HOST, "pid": dead.pid, "time": 0.0, "kind": "save", "token": "",
            "pidns": os.readlink("/proc/self/ns/pid") if os.path.exists("/proc/self/ns/pid") else None,
            "boot": open("/proc/sys/kernel/random/boot_id").read().strip()
            if os.path.exists("/proc/sys/kernel/random/boot_id") else None}
    with open(os.path.join(repo, "locks", "save-dead"), "wb") as f:
        f.write(msgpack_io.pack(body))
    before = _tree(repo)
    rep = deltackpt.gc(repo, keep_last=1, dry_run=True)
    assert len(rep.removed) == 2 and rep.reclaimed_bytes > 0
    assert _tree(repo) == before, "a dry run changed the repository"


def test_gc_dry_run_on_a_read_only_filesystem(small_fs):
    """``deltackpt gc --dry-run`` works on a repository mounted read-only (it used to need to write
    ``locks/gc``)."""
    from tests.conftest import run_cli
    repo = os.path.join(small_fs, "repo")
    _three_versions(repo)
    ro = subprocess.run(["mount", "-o", "remount,ro", small_fs], capture_output=True, text=True)
    if ro.returncode != 0:
        pytest.skip(f"cannot remount read-only: {ro.stderr.strip()}")
    proc = run_cli("gc", "--repo", repo, "--keep-last", "1", "--dry-run", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "would remove 2 version(s)" in proc.stdout, proc.stdout
    record("readonly-gc-dry-run", points=1, writes=0)
