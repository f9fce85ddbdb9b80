"""Deltas, keyframes and bounded chains on real repositories with a real model and optimizer."""

from __future__ import annotations

import torch

import deltackpt
from deltackpt.frontend import api
from deltackpt.store.counting import CountingStore
from deltackpt.store.local import LocalStore
from tests.strategies import assert_bit_identical

DELTA_CODECS = {"xor-delta", "sub-delta", "scaled-delta", "sparse"}


def _trainer(seed: int = 0):
    """A small real model and AdamW; ``step(n)`` trains n steps and returns a copy of the full state."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(512, 32), torch.nn.Flatten(), torch.nn.Linear(4 * 32, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)

    def step(n: int) -> dict:
        for _ in range(n):
            ids = torch.randint(0, 512, (32, 4), generator=g)
            loss = torch.nn.functional.cross_entropy(model(ids), ids[:, 0] % 4)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return {"model": {k: v.clone() for k, v in model.state_dict().items()},
                "optimizer": _clone(opt.state_dict())}
    return step


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def _depths(repo: deltackpt.Repo) -> list[int]:
    return [e.depth for _cid, _pid, e in repo.core.index_items()]


def test_second_save_is_stored_as_deltas(tmp_path):
    """The first save is keyframes; the next, after training, uses delta codecs and writes fewer bytes
    than the same state saved as keyframes into an empty repository."""
    repo_path = str(tmp_path / "repo")
    step = _trainer()
    v1 = deltackpt.save(step(20), repo_path)
    state = step(5)
    v2 = deltackpt.save(state, repo_path)
    alone = deltackpt.save(state, str(tmp_path / "alone"))
    repo = deltackpt.Repo(repo_path)
    first, second = repo.show(v1.id)["written"]["encodings"], repo.show(v2.id)["written"]["encodings"]
    assert not DELTA_CODECS & set(first)
    assert DELTA_CODECS & set(second), second
    assert v2.written_bytes < 0.9 * alone.written_bytes


def test_chains_never_exceed_the_keyframe_interval(repo_path):
    """With K=3, every stored object is at most 3 deltas from a keyframe, over 9 saves."""
    deltackpt.Repo.init(repo_path, keyframe_interval=3)
    step = _trainer()
    for _ in range(9):
        deltackpt.save(step(2), repo_path)
    depths = _depths(deltackpt.Repo(repo_path))
    assert max(depths) == 3 and 0 in depths


def test_restoring_any_version_decodes_at_most_k_plus_one_objects_per_chunk(tmp_path):
    """A fresh reader of any version reads <= K+1 objects per chunk from the packs, bit-identically."""
    k = 3
    path = str(tmp_path / "repo")
    deltackpt.Repo.init(path, keyframe_interval=k)
    step = _trainer()
    saved = [(deltackpt.save(s, path), s) for s in (step(2) for _ in range(7))]
    for v, state in saved:
        api._OPEN.clear()  # a new process: nothing decoded in memory
        store = CountingStore(LocalStore(path))
        repo = deltackpt.Repo(store)
        chunks = sum(len(b.chunks) for b in repo.core.manifest(v.id).blobs)
        store.reset()
        assert_bit_identical(state, deltackpt.load(repo, v.id))
        pack_reads = sum(1 for key in store.keys_read if key.startswith("packs/"))
        assert pack_reads <= (k + 1) * chunks, (v.id, pack_reads, chunks)
    assert max(_depths(deltackpt.Repo(path))) == k


def test_load_reports_lossy_versions_as_inexact(repo_path):
    """q8-delta on the optimizer makes later versions inexact, with the error recorded per tensor."""
    step = _trainer()
    enc = {"optimizer.*": "q8-delta"}
    deltackpt.save(step(1), repo_path, encoding=enc)
    truth = step(3)
    deltackpt.save(truth, repo_path, encoding=enc)
    state, version = deltackpt.load(repo_path, return_version=True)
    assert version.exact is False
    assert_bit_identical(truth["model"], state["model"])
    shown = deltackpt.Repo(repo_path).show()
    assert shown["exact"] is False
    opt = [t for t in shown["tensors"] if t["name"].startswith("optimizer.") and t["name"].endswith("exp_avg")]
    assert opt and all(t["encoding"] == "q8-delta" and not t["exact"] for t in opt)
    assert any(t["max_abs_err"] > 0 for t in opt)
    for t in opt:
        name = t["name"].split(".")
        got = state["optimizer"]["state"][int(name[2])]["exp_avg"]
        want = truth["optimizer"]["state"][int(name[2])]["exp_avg"]
        assert (got - want).abs().max().item() <= t["max_abs_err"] + 1e-12
    assert all(t["exact"] for t in shown["tensors"] if t["name"].startswith("model."))


def test_gc_keeps_kept_versions_restorable_across_chains(repo_path):
    """gc that removes the bases of a kept mid-chain version rebases it; every kept version still loads."""
    deltackpt.Repo.init(repo_path, keyframe_interval=8)
    step = _trainer()
    saved = [(deltackpt.save(s, repo_path), s) for s in (step(2) for _ in range(6))]
    repo = deltackpt.Repo(repo_path)
    repo.tag("mid", saved[3][0].id)
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert report.chunks_rebased > 0
    api._OPEN.clear()
    for v, state in (saved[3], saved[5]):
        assert_bit_identical(state, deltackpt.load(repo_path, v.id))
    assert deltackpt.Repo(repo_path).verify().ok
    # the chain after gc is still bounded and a new save continues from the cache-less handle
    deltackpt.save(step(2), repo_path)
    assert max(_depths(deltackpt.Repo(repo_path))) <= 8
