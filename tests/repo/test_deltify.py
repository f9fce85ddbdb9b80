"""The default write topology (delta_base "child"): a save writes each changed chunk once (whole, or
a small forward delta, head.py); deltification later re-stores older versions' keyframes as
reverse deltas against newer chunks and drops the keyframes (deltify.py)."""

from __future__ import annotations

import copy
import os
import statistics

import pytest
import torch

import deltackpt
from deltackpt import api
from deltackpt.repo.repository import Repository
from deltackpt.store.counting import CountingStore
from deltackpt.store.local import LocalStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def _train(path: str, saves: int, *, frozen: bool = False, deltify: bool = False, **init) -> list:
    """Save ``saves`` versions of an MLP and its AdamW state; returns deep copies of each state.
    ``deltify``: deltify after every save, as the background thread does (lag 1)."""
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
        if deltify:
            deltackpt.Repo(path).deltify()
    return states


def _rows(path: str, saves: int, *, rows: int = 16384, dim: int = 64, touched: int = 200, seed: int = 0,
          **init) -> list:
    """An embedding table of which each save changes ``touched`` random rows (a sparse update);
    returns the saved tables."""
    g = torch.Generator().manual_seed(seed)
    if init:
        deltackpt.Repo.init(path, **init)
    table = torch.randn(rows, dim, generator=g)
    out = []
    for step in range(saves):
        if step:
            idx = torch.randint(0, rows, (touched,), generator=g)
            table[idx] += 0.01 * torch.randn(touched, dim, generator=g)
        deltackpt.save({"emb": table}, path, step=step)
        out.append(table.clone())
    return out


def _written(path: str, rev: str) -> dict:
    repo = Repository(path)
    return repo.manifest(repo.resolve(rev)).extra["written"]


def _depths(repo: Repository, rev: str) -> list[int]:
    m = repo.manifest(repo.resolve(rev))
    return [repo.chain_depth(c.chunk_id) for b in m.blobs for c in b.chunks]


def _pack_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(path, "packs")) for f in fs)


def test_a_save_writes_each_changed_chunk_once(tmp_path):
    """Every weight and moment of a dense fine-tune changes: each save writes one object per changed
    chunk (no reverse delta of the previous version beside it), fewer bytes than the raw state, and
    the newest version decodes one object per chunk."""
    path = str(tmp_path / "r")
    states = _train(path, 4)
    api._OPEN.clear()
    repo = Repository(path)
    raw = sum(b.nbytes for b in repo.manifest(repo.resolve("latest")).blobs)
    for k in range(3):
        written = _written(path, f"latest~{k}")
        m = repo.manifest(repo.resolve(f"latest~{k}"))
        parent = repo.manifest(m.parent)
        changed = {c.chunk_id for b in m.blobs for c in b.chunks} - {c.chunk_id for b in parent.blobs for c in b.chunks}
        assert written["chunks_new"] == len(changed), (k, written)
        assert written["bytes"] < raw
    assert set(_depths(repo, "latest")) == {0}
    for k in range(4):
        assert _same(deltackpt.load(path, f"latest~{k}"), states[3 - k])


def test_sparse_changes_are_forward_deltas_within_the_budget(tmp_path):
    """An embedding table of which each save touches a few rows: a save writes sparse deltas, far
    smaller than the table; the deltas since a position's keyframe never exceed the head budget
    (x that keyframe), so the newest version reads at most (1 + budget) keyframes per chunk; every
    version loads bit-identical."""
    from deltackpt.repo.write.head import HEAD_DELTA_BUDGET
    path = str(tmp_path / "r")
    tables = _rows(path, 12)
    api._OPEN.clear()
    repo = Repository(path)
    first = _written(path, tables and f"latest~{len(tables) - 1}")["bytes"]
    later = [_written(path, f"latest~{k}")["bytes"] for k in range(len(tables) - 1)]
    assert statistics.median(later) < 0.2 * first
    assert _written(path, "latest~5")["encodings"].get("sparse", 0) > 0
    m = repo.manifest(repo.resolve("latest"))
    for c in (c for b in m.blobs for c in b.chunks):
        chain, cur = [], c.chunk_id
        while cur is not None:
            e = repo.entry(cur)[1]
            chain.append(e)
            cur = e.base
        anchor, deltas = chain[-1], chain[:-1]
        assert anchor.base is None and len(chain) <= 1 + repo.config.keyframe_interval
        assert sum(e.length for e in deltas) <= HEAD_DELTA_BUDGET * anchor.length
    assert max(_depths(repo, "latest")) >= 1
    for k, table in enumerate(reversed(tables)):
        assert torch.equal(deltackpt.load(path, f"latest~{k}")["emb"], table)


def test_a_dense_change_after_sparse_ones_starts_a_new_keyframe(tmp_path):
    """When a position that took sparse deltas changes everywhere, the save writes it whole: the
    chain is re-anchored instead of growing by a delta as large as the table."""
    path = str(tmp_path / "r")
    tables = _rows(path, 3)
    dense = tables[-1] + 0.01 * torch.randn_like(tables[-1])
    deltackpt.save({"emb": dense}, path, step=3)
    api._OPEN.clear()
    repo = Repository(path)
    assert set(_depths(repo, "latest")) == {0}
    assert torch.equal(deltackpt.load(path)["emb"], dense)


def test_deltify_turns_older_keyframes_into_reverse_deltas(tmp_path):
    """Deltify re-stores the older versions' keyframes as deltas against newer chunks and drops them:
    the repository ends near the size of forward chains and below a keyframe per version, the
    newest version stays as saved, older ones decode through bounded chains, every version loads
    bit-identical, and every byte written frees more than itself."""
    child, parent, whole = str(tmp_path / "child"), str(tmp_path / "parent"), str(tmp_path / "k0")
    states = _train(child, 7, keyframe_interval=3)
    _train(parent, 7, delta_base="parent")
    _train(whole, 7, keyframe_interval=0)
    api._OPEN.clear()
    before = _pack_bytes(child)
    latest_depths = _depths(Repository(child), "latest")
    report = deltackpt.Repo(child).deltify()
    assert report.chunks > 0 and report.freed_bytes > report.written_bytes
    api._OPEN.clear()
    repo = Repository(child)
    assert _depths(repo, "latest") == latest_depths
    assert max(_depths(repo, "latest~1")) >= 1
    for k in range(7):
        assert max(_depths(repo, f"latest~{k}")) <= 3
        assert _same(deltackpt.load(child, f"latest~{k}"), states[6 - k]), k
    assert _pack_bytes(child) < before
    assert _pack_bytes(child) < 1.15 * _pack_bytes(parent)
    assert _pack_bytes(child) < 0.97 * _pack_bytes(whole)  # AdamW moments of a tiny MLP: deltas save ~10-25%
    assert deltackpt.Repo(child).verify().ok
    again = deltackpt.Repo(child).deltify()
    assert again.chunks == 0 and again.written_bytes == 0  # nothing is re-encoded twice


def test_deltify_never_touches_the_chains_the_newest_versions_read(tmp_path):
    """With sparse forward deltas at the head, the keyframes their chains start from stay whole
    (every newer chunk there descends from them), and latest reads exactly what it read before."""
    path = str(tmp_path / "r")
    tables = _rows(path, 8)
    api._OPEN.clear()
    repo = Repository(path)
    m = repo.manifest(repo.resolve("latest"))
    chains = {c.chunk_id: repo.chunk_closure([c.chunk_id]) for b in m.blobs for c in b.chunks}
    entries = {x: repo.entry(x) for cl in chains.values() for x in cl}
    deltackpt.Repo(path).deltify(lag=1)
    api._OPEN.clear()
    repo = Repository(path)
    assert {x: repo.entry(x) for cl in chains.values() for x in cl} == entries
    for k, table in enumerate(reversed(tables)):
        assert torch.equal(deltackpt.load(path, f"latest~{k}")["emb"], table)


def test_frozen_layers_keep_their_keyframes_and_the_trained_layer_is_deltified(tmp_path):
    """A fine-tune that changes one layer: the first version's pack, mostly frozen layers, is
    rewritten without the changed layer's keyframes once they are deltified, so the repository
    stays near forward chains' size."""
    child, parent = str(tmp_path / "child"), str(tmp_path / "parent")
    states = _train(child, 5, frozen=True, deltify=True)
    _train(parent, 5, frozen=True, delta_base="parent")
    api._OPEN.clear()
    assert _pack_bytes(child) < 1.15 * _pack_bytes(parent)
    for k in range(5):
        assert _same(deltackpt.load(child, f"latest~{k}"), states[4 - k])


def test_deltify_is_bounded_and_resumable(tmp_path):
    """max_bytes stops a run after that many keyframe bytes and reports what is left; the next run
    goes on from there; the result equals one unbounded run's."""
    path = str(tmp_path / "r")
    states = _train(path, 6)
    api._OPEN.clear()
    first = deltackpt.Repo(path).deltify(max_bytes=1)
    assert first.chunks >= 1 and first.remaining > 0
    rest = deltackpt.Repo(path).deltify()
    assert rest.chunks > 0 and rest.remaining == 0
    assert deltackpt.Repo(path).deltify().chunks == 0
    for k in range(6):
        assert _same(deltackpt.load(path, f"latest~{k}"), states[5 - k])


def test_versions_retention_drops_first_never_cost_a_delta_write(tmp_path):
    """A training loop keeping the last 3 versions: gc after every save, deltification behind
    that window, so nothing is ever deltified (no delta write), and the kept versions load."""
    from deltackpt.repo.maintain.retention import Retention
    path = str(tmp_path / "r")
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = deltackpt.Checkpointer(path, policy=1, retention=Retention(keep_last=3), blocking=True)
    reports = []
    for step in range(8):
        model(torch.randn(8, 512)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt.step({"model": model.state_dict(), "optimizer": opt.state_dict()}, step=step)
        reports.append(deltackpt.Repo(path).deltify(lag=ckpt.repo.core.deltify_lag))
    ckpt.close()
    assert ckpt.repo.core.deltify_lag == 3
    assert sum(r.chunks for r in reports) == 0 and sum(r.written_bytes for r in reports) == 0
    assert len(deltackpt.Repo(path).log()) == 3


def test_background_deltify_runs_after_saves_and_stops_at_exit(tmp_path):
    """With deltification in the background (the default outside the test suite), saves return at
    once, the older versions end up deltified, and a script that ends while it runs leaves a
    repository that verifies and loads every version."""
    import subprocess
    import sys
    path = str(tmp_path / "r")
    script = f"""
import os, sys, torch
sys.path.insert(0, {ROOT!r})
os.environ["DELTACKPT_DELTIFY"] = "on"
import deltackpt
from deltackpt.repo.write import background
from deltackpt.api.handles import open_core
torch.manual_seed(0)
w = torch.randn(1024, 1024)
for i in range(5):
    w += 0.01 * torch.randn(1024, 1024)
    deltackpt.save({{"w": w}}, {path!r}, step=i)
d = background.deltifier(open_core({path!r}))
if sys.argv[1] == "wait":
    assert d.wait_idle(120), "deltify did not finish"
    print("deltified", d.chunks_done)
"""
    env = {**os.environ, "DELTACKPT_DELTIFY": "on"}
    out = subprocess.run([sys.executable, "-c", script, "wait"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 0
    assert deltackpt.Repo(path).verify().ok
    path2 = path + "2"
    out = subprocess.run([sys.executable, "-c", script.replace(repr(path), repr(path2)), "exit"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert deltackpt.Repo(path2).verify().ok and len(deltackpt.Repo(path2).log()) == 5


def test_closing_a_handle_stops_its_background_deltification(tmp_path, monkeypatch):
    """``Repo.close`` stops the handle's deltification at a safe point and waits for it, so the
    folder can be deleted right after (a benchmark's rmtree once raced the deltifier's lock file)."""
    import shutil

    from deltackpt.repo.write import background
    monkeypatch.setattr(background, "AUTO", True)
    path = str(tmp_path / "r")
    torch.manual_seed(0)
    w = torch.randn(1024, 1024)
    for i in range(6):
        w += 0.01 * torch.randn(1024, 1024)
        deltackpt.save({"w": w}, path, step=i)
    repo = deltackpt.Repo(path)
    d = background.deltifier(repo.core)
    assert d._thread is not None
    repo.close()
    assert not d._thread.is_alive()
    shutil.rmtree(path)
    assert not os.path.exists(path)


def test_values_that_come_back_form_no_unreadable_cycle(tmp_path):
    """A tensor that alternates between two values (A, B, A, B, ...) gets copies naming each other as
    bases once deltified; every version still loads, latest stays whole, and gc keeps them
    readable."""
    path = str(tmp_path / "r")
    a, b = torch.randn(512, 1024), torch.randn(512, 1024)
    b[::7] = a[::7]  # similar enough for a delta to pay
    for i in range(6):
        deltackpt.save({"w": (a if i % 2 == 0 else b).clone(), "i": i}, path, step=i)
        deltackpt.Repo(path).deltify(lag=1)
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


def test_a_new_process_deltifies_what_an_earlier_one_saved(tmp_path):
    """A restarted run has none of the earlier chunks in memory: deltify reads them back from the
    repository, and every version of both runs loads."""
    path = str(tmp_path / "r")
    states = _train(path, 3)
    api._OPEN.clear()  # as if the process restarted: no delta cache
    more = _train(path, 3)
    api._OPEN.clear()
    assert deltackpt.Repo(path).deltify().chunks > 0
    api._OPEN.clear()
    history = states + more
    for k in range(6):
        assert _same(deltackpt.load(path, f"latest~{k}"), history[5 - k])
    repo = Repository(path)
    assert any(max(_depths(repo, f"latest~{k}")) >= 1 for k in range(2, 6))


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
    assert deltackpt.Repo(path).deltify().chunks == 0  # no reverse delta in a format-1 repository


def test_verify_racing_a_deltify_that_drops_packs_reports_no_damage(tmp_path):
    """Deltify deletes the packs its reverse deltas made redundant; a verify that listed them just
    before finds them gone, sees that no index names them any more, and reports nothing."""
    from deltackpt.repo.layout import PACKS
    from deltackpt.repo.maintain.verify import run_verify
    from deltackpt.store.base import WrappingStore

    path = str(tmp_path / "r")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(512, 1024, generator=g)
    for _ in range(3):
        w += 1e-3 * torch.randn(512, 1024, generator=g)
        deltackpt.save({"w": w}, path)
    before = set(os.listdir(os.path.join(path, "index")))

    class DeltifyBetweenReads(WrappingStore):
        """Lets a deltify run right after verify listed the packs (a real one, in between)."""
        fired = False

        def list(self, prefix: str) -> list[str]:
            out = self.inner.list(prefix)
            if prefix == PACKS and not self.fired:
                self.fired = True
                assert deltackpt.Repo(path).deltify(lag=1).chunks > 0
            return out

    store = DeltifyBetweenReads(LocalStore(path))
    report = run_verify(Repository(store))
    assert store.fired and before - set(os.listdir(os.path.join(path, "index")))  # packs were dropped
    assert report.ok, report.to_json()
