"""A repository at ``s3://bucket/run1`` on a real S3 server (moto on loopback): the whole API,
crashes mid-upload, racing committers, ranged layer reads and the local read cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import deltackpt
from deltackpt.api import Repo
from deltackpt.store import CountingStore, FsspecStore
from tests.conftest import ROOT
from tests.strategies import assert_bit_identical


def _model_state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"encoder": {"w": torch.randn(128, 256, generator=g), "b": torch.randn(256, generator=g)},
            "decoder": {"w": torch.randn(256, 128, generator=g)}, "step": seed}


def _child(url: str, seed: int, steps: int, rows: int = 64, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.store.s3_child", url, str(seed), str(steps), str(rows)],
                            cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_save_load_restore_gc_verify_on_s3(s3_url):
    """save, load, restore, tag, gc and verify work on s3://bucket/run1 exactly as on a local path."""
    states = [_model_state(i) for i in range(3)]
    versions = [deltackpt.save(s, s3_url, step=i) for i, s in enumerate(states)]
    repo = deltackpt.Repo(s3_url)
    assert [v.id for v in repo.log()] == [v.id for v in reversed(versions)]
    assert_bit_identical(states[1], deltackpt.load(s3_url, "latest~1"))
    model = torch.nn.Linear(256, 128)
    deltackpt.save(model, s3_url)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    deltackpt.restore(model, s3_url)
    assert_bit_identical(before, model.state_dict())
    repo.tag("first", versions[0].id)
    report = deltackpt.gc(s3_url, keep_last=1, grace_seconds=0)
    assert set(report.removed) == {versions[1].id, versions[2].id}
    assert_bit_identical(states[0], deltackpt.load(s3_url, "first"))
    assert repo.verify().ok


@pytest.mark.parametrize("site", [pytest.param("pack.write:1:kill", marks=pytest.mark.slow), "index.write:1:kill"])
def test_sigkill_during_upload_leaves_no_version(s3_url, site):
    """A saver SIGKILLed as it uploads its pack, or after its packs are up but before its index,
    commits nothing; the repository verifies and the next save works."""
    first = deltackpt.save(_model_state(0), s3_url)
    packs_before = Repo(s3_url).core.store.list("packs/")
    proc = _child(s3_url, 7, 1, rows=4 * 1024, env={"DELTACKPT_FAULT": site})
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    repo = Repo(s3_url)
    assert [v.id for v in repo.log()] == [first.id]
    if site.startswith("index"):
        assert len(repo.core.store.list("packs/")) > len(packs_before), "its pack was uploaded before it died"
    assert repo.verify().ok
    second = deltackpt.save(_model_state(1), s3_url)
    assert Repo(s3_url).resolve("latest").id == second.id


@pytest.mark.slow
def test_sigkill_at_random_time_during_upload(s3_url):
    """A saver killed by the parent at an arbitrary moment of a long upload leaves only whole
    versions behind: every listed version loads and verify passes."""
    deltackpt.save(_model_state(0), s3_url)
    proc = _child(s3_url, 3, 3, rows=16 * 1024)
    proc.stdout.readline()  # the first version is in: kill during the next ones
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    repo = Repo(s3_url)
    for v in repo.log():
        repo.load(v.id)
    assert repo.verify().ok


@pytest.mark.slow
def test_two_concurrent_committers_keep_linear_history(s3_url):
    """Two processes saving to one S3 repository at once lose no version and leave a linear history."""
    deltackpt.save({"w": torch.zeros(4)}, s3_url)
    procs = [_child(s3_url, seed, 2) for seed in (1, 2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (_o, err) in zip(procs, outs):
        assert p.returncode == 0, err
    written = {line for out, _ in outs for line in out.split()}
    assert len(written) == 4
    repo = Repo(s3_url)
    log = repo.log()
    assert written <= {v.id for v in log} and len(log) == 5
    # linear: following parents from latest visits every version once
    chain, cur = [], repo.resolve("latest").id
    while cur is not None:
        chain.append(cur)
        cur = repo.core.manifest(cur).parent
    assert sorted(chain) == sorted(v.id for v in log)
    assert repo.verify().ok


def _wait_stopped(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until ``proc`` has SIGSTOPped itself (state T), or it ended (then its stderr is the failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"child ended before its fault: {proc.stderr.read()}")
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.02)
    raise AssertionError("child never reached its fault site")


def test_committer_whose_refs_lock_was_broken_loses_no_version(s3_url):
    """A committer frozen just before it moves 'latest', whose refs lock another host then breaks
    and who commits meanwhile, does not overwrite that version: its If-Match PUT fails, it
    re-parents onto the new head, and history stays linear with both versions."""
    first = deltackpt.save(_model_state(0), s3_url)
    proc = _child(s3_url, 5, 1, env={"DELTACKPT_FAULT": "ref.write:1:stop"})
    try:
        _wait_stopped(proc)
        store = FsspecStore(s3_url, cache_dir=False)
        assert store.exists("locks/refs"), "the frozen child holds the refs lock"
        store.delete("locks/refs")  # what a breaker on another host that judged it stale does
        mine = deltackpt.save(_model_state(1), s3_url)
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    theirs = out.split()[0]
    repo = Repo(s3_url)
    assert repo.resolve("latest").id == theirs
    assert repo.core.manifest(theirs).parent == mine.id, "the late committer re-parented onto the new head"
    assert repo.core.manifest(mine.id).parent == first.id
    assert {v.id for v in repo.log()} == {first.id, mine.id, theirs}, "no orphan manifest from the lost swap"
    assert not store.exists("locks/refs"), "no lock is left behind"
    assert_bit_identical(_model_state(1), repo.load(mine.id))
    assert repo.verify().ok


def test_layer_restore_fetches_only_its_byte_ranges(s3_url):
    """Loading one layer from S3 issues ranged GETs for that layer's chunks only: the bytes fetched
    from packs are about that layer's stored size, not the whole version's."""
    deltackpt.save(_model_state(5), s3_url)
    counting = CountingStore(FsspecStore(s3_url, cache_dir=False))
    repo = Repo(counting)
    repo.core.index.refresh()
    m = repo.core.manifest(repo.core.resolve("latest"))
    counting.reset()
    state = repo.load(layers=["encoder"])
    assert_bit_identical(_model_state(5)["encoder"], state["encoder"])
    pack_reads = [k for k in counting.keys_read if k.startswith("packs/")]
    enc_blobs = {t.blob for t in m.tensors if t.name.startswith("encoder.")}
    enc_chunks = [c for b in enc_blobs for c in m.blobs[b].chunks]
    total = repo.core.index.stored_size(c.chunk_id for b in m.blobs for c in b.chunks)
    wanted = repo.core.index.stored_size(c.chunk_id for c in enc_chunks)
    assert 1 <= len(pack_reads) <= len(enc_chunks)  # adjacent chunks share one ranged GET
    assert counting.bytes_read <= wanted + 1024 and wanted < total * 0.6  # + the ref read by "latest"


def test_read_cache_avoids_redownloading_on_rollback(s3_url, tmp_path):
    """Rolling back twice to the same version downloads its chunks once: the second restore is
    served from the local read cache (zero pack bytes fetched)."""
    for i in range(2):
        deltackpt.save(_model_state(10 + i), s3_url)
    store = FsspecStore(s3_url, cache_dir=tmp_path / "cache", cache_bytes=64 << 20)
    repo = Repo(store)
    first = repo.load("latest~1")
    fetched = store.cache.bytes_fetched
    assert fetched > 0 and store.cache.hits == 0
    again = repo.load("latest~1")
    assert store.cache.bytes_fetched == fetched and store.cache.hits > 0
    assert_bit_identical(first, again)
    # a new process (a new store over the same cache folder) also finds them
    store2 = FsspecStore(s3_url, cache_dir=tmp_path / "cache", cache_bytes=64 << 20)
    assert_bit_identical(first, Repo(store2).load("latest~1"))
    assert store2.cache.misses == 0 and store2.cache.bytes_fetched == 0  # index, manifest, chunks: all cached
