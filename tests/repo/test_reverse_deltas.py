"""Format 2's write topology (delta_base "child"): the newest version is stored whole, older ones
become reverse deltas against newer chunks, and the keyframes those replace are dropped."""

from __future__ import annotations

import copy
import os

import pytest
import torch

import deltackpt
from deltackpt import api
from deltackpt.repo.repository import Repository
from deltackpt.store.counting import CountingStore
from deltackpt.store.local import LocalStore


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and _bits(a) == _bits(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _train(path: str, saves: int, *, frozen: bool = False, **init) -> list:
    """Save ``saves`` versions of an MLP and its AdamW state; returns deep copies of each state."""
    torch.manual_seed(0)
    if init:
        deltackpt.Repo.init(path, **init)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    params = list(model[2].parameters()) if frozen else list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    states = []
    for step in range(saves):
        loss = model(torch.randn(32, 256)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        deltackpt.save(state, path, step=step)
        states.append(copy.deepcopy(state))
    return states


def _depths(repo: Repository, rev: str) -> list[int]:
    m = repo.manifest(repo.resolve(rev))
    return [repo.chain_depth(c.chunk_id) for b in m.blobs for c in b.chunks]


def _pack_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(path, "packs")) for f in fs)


def test_newest_version_is_whole_and_older_ones_are_bounded_reverse_chains(tmp_path):
    """latest decodes one object per chunk, latest~k at most k + 1 for k < K, never more than K + 1,
    and every version loads bit-identical to what was saved."""
    path = str(tmp_path / "r")
    states = _train(path, 7, keyframe_interval=3)
    api._OPEN.clear()
    repo = Repository(path)
    assert repo.config.version == 2 and repo.config.delta_base == "child"
    assert set(_depths(repo, "latest")) == {0}
    for k in range(7):
        depths = _depths(repo, f"latest~{k}")
        assert max(depths) <= min(k, 3), (k, depths)
        assert _same(deltackpt.load(path, f"latest~{k}"), states[6 - k]), k
    assert max(max(_depths(repo, f"latest~{k}")) for k in range(7)) >= 2  # reverse chains exist


def test_latest_reads_only_keyframes_once(tmp_path):
    """Restoring latest reads each of its chunks' objects once and nothing else: the bytes fetched
    equal the stored size of latest's chunks (no base objects, no superseded keyframes)."""
    path = str(tmp_path / "r")
    states = _train(path, 5)
    api._OPEN.clear()
    counting = CountingStore(LocalStore(path))
    repo = deltackpt.Repo(counting)
    core = repo.core
    m = core.manifest(core.resolve("latest"))
    chunks = [c.chunk_id for b in m.blobs for c in b.chunks]  # a chunk shared by two blobs is read twice
    counting.reset()
    assert _same(repo.load("latest"), states[-1])
    packs = [k for k in counting.keys_read if k.startswith("packs/")]
    assert len(packs) <= len(chunks)
    pack_bytes = counting.bytes_read - sum(counting.inner.size(k) for k in counting.keys_read if not k.startswith("packs/"))
    assert 0 < pack_bytes <= core.stored_size(chunks)
    assert all(core.entry(c)[1].base is None for c in chunks)


def test_superseded_head_keyframes_are_dropped(tmp_path):
    """After each save the previous head keyframes' packs are gone: the repository holds about what
    forward chains hold (one delta per changed chunk per version), not a keyframe per version."""
    child, parent = str(tmp_path / "child"), str(tmp_path / "parent")
    _train(child, 6)
    _train(parent, 6, delta_base="parent")
    api._OPEN.clear()
    all_keyframes = str(tmp_path / "k0")
    _train(all_keyframes, 6, keyframe_interval=0)
    assert _pack_bytes(child) < 1.1 * _pack_bytes(parent)
    assert _pack_bytes(child) < 0.95 * _pack_bytes(all_keyframes)


def test_frozen_layers_rewrite_the_first_pack_once(tmp_path):
    """A fine-tune that changes one layer: the first version's pack, mostly frozen layers, is rewritten
    without the changed layer's keyframes, so the repository stays near forward chains' size."""
    child, parent = str(tmp_path / "child"), str(tmp_path / "parent")
    states = _train(child, 5, frozen=True)
    _train(parent, 5, frozen=True, delta_base="parent")
    api._OPEN.clear()
    assert _pack_bytes(child) < 1.1 * _pack_bytes(parent)
    for k in range(5):
        assert _same(deltackpt.load(child, f"latest~{k}"), states[4 - k])


def test_values_that_come_back_form_no_unreadable_cycle(tmp_path):
    """A tensor that alternates between two values (A, B, A, B, ...) gets copies naming each other as
    bases; every version still loads, latest stays whole, and gc keeps them readable."""
    path = str(tmp_path / "r")
    a, b = torch.randn(512, 1024), torch.randn(512, 1024)
    b[::7] = a[::7]  # similar enough for a delta to pay
    for i in range(6):
        deltackpt.save({"w": (a if i % 2 == 0 else b).clone(), "i": i}, path, step=i)
    api._OPEN.clear()
    repo = Repository(path)
    assert set(_depths(repo, "latest")) == {0}
    for k in range(6):
        got = deltackpt.load(path, f"latest~{k}")
        assert got["i"] == 5 - k and torch.equal(got["w"], a if (5 - k) % 2 == 0 else b)
    deltackpt.Repo(path).gc(keep_last=3)
    api._OPEN.clear()
    for k in range(3):
        assert torch.equal(deltackpt.load(path, f"latest~{k}")["w"], a if (5 - k) % 2 == 0 else b)
    assert deltackpt.Repo(path).verify().ok


def test_a_new_process_keeps_the_previous_head_as_a_retained_keyframe(tmp_path):
    """Without the previous chunks in memory (a restarted run) the previous head keeps its keyframes;
    nothing is lost and the next saves go on with reverse deltas."""
    path = str(tmp_path / "r")
    states = _train(path, 3)
    api._OPEN.clear()  # as if the process restarted: no delta cache
    more = _train(path, 3)
    api._OPEN.clear()
    history = states + more
    for k in range(6):
        assert _same(deltackpt.load(path, f"latest~{k}"), history[5 - k])
    assert set(_depths(Repository(path), "latest~3")) == {0}  # the old head, retained


def test_format_1_repository_stays_format_1(tmp_path):
    """Saving into a format-1 repository writes forward chains and leaves its config at version 1;
    asking it for reverse deltas is refused."""
    path = str(tmp_path / "r")
    deltackpt.Repo.init(path)
    from deltackpt.format import config as cfg
    raw = open(os.path.join(path, "config"), "rb").read()
    c = cfg.decode(raw, where=path)
    c.version, c.delta_base = 1, "parent"
    with open(os.path.join(path, "config"), "wb") as f:
        f.write(c.to_bytes())
    api._OPEN.clear()
    _train(path, 3)
    api._OPEN.clear()
    repo = Repository(path)
    assert repo.config.version == 1 and max(_depths(repo, "latest")) >= 1
    with pytest.raises(deltackpt.DeltackptError, match="format-2"):
        deltackpt.Repo(path, delta_base="child")


def test_verify_racing_a_save_that_drops_superseded_packs_reports_no_damage(tmp_path):
    """A save deletes the packs its reverse deltas made redundant; a verify that listed them just
    before finds them gone, sees that no index names them any more, and reports nothing."""
    from deltackpt.repo.layout import PACKS
    from deltackpt.repo.verify import run_verify
    from deltackpt.store.base import WrappingStore

    path = str(tmp_path / "r")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(512, 1024, generator=g)
    for _ in range(2):
        w += 1e-3 * torch.randn(512, 1024, generator=g)
        deltackpt.save({"w": w}, path)
    before = set(os.listdir(os.path.join(path, "index")))

    class SaveBetweenReads(WrappingStore):
        """Lets the next save run right after verify listed the packs (a real save, in between)."""
        fired = False

        def list(self, prefix: str) -> list[str]:
            out = self.inner.list(prefix)
            if prefix == PACKS and not self.fired:
                self.fired = True
                deltackpt.save({"w": w + 1e-3}, path)
            return out

    store = SaveBetweenReads(LocalStore(path))
    report = run_verify(Repository(store))
    assert store.fired and before - set(os.listdir(os.path.join(path, "index")))  # packs were dropped
    assert report.ok, report.to_json()
