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
