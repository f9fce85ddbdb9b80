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
from deltackpt.repo.repository import Repository
from deltackpt.store.counting import CountingStore
from deltackpt.store.local import LocalStore

#: these tests check deltification's mechanics on runs whose deltas save a quarter or so of a
#: keyframe (dense fine-tunes): they ask it to rewrite whatever saves at least 5% (the default,
#: head.PAYBACK, leaves those whole; tests/repo/test_maintenance_payback.py pins the default)
MECHANICS = 0.05

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
    ``deltify``: deltify after every save, as a save does after it commits (lag 1)."""
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
            deltackpt.Repo(path).deltify(payback=MECHANICS)
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
    return [repo.index.chain_depth(c.chunk_id) for b in m.blobs for c in b.chunks]


def _pack_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(path, "packs")) for f in fs)


def test_a_save_writes_each_changed_chunk_once(tmp_path):
    """Every weight and moment of a dense fine-tune changes: each save writes one object per changed
    chunk (no reverse delta of the previous version beside it), fewer bytes than the raw state, and
    the newest version decodes one object per chunk."""
    path = str(tmp_path / "r")
    states = _train(path, 4)
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
    repo = Repository(path)
    first = _written(path, tables and f"latest~{len(tables) - 1}")["bytes"]
    later = [_written(path, f"latest~{k}")["bytes"] for k in range(len(tables) - 1)]
    assert statistics.median(later) < 0.2 * first
    assert _written(path, "latest~5")["encodings"].get("sparse", 0) > 0
    m = repo.manifest(repo.resolve("latest"))
    for c in (c for b in m.blobs for c in b.chunks):
        chain, cur = [], c.chunk_id
        while cur is not None:
            e = repo.index.entry(cur)[1]
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
    before = _pack_bytes(child)
    latest_depths = _depths(Repository(child), "latest")
    report = deltackpt.Repo(child).deltify(payback=MECHANICS)
    assert report.chunks > 0 and report.freed_bytes > report.written_bytes
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
    again = deltackpt.Repo(child).deltify(payback=MECHANICS)
    assert again.chunks == 0 and again.written_bytes == 0  # nothing is re-encoded twice


def test_deltify_never_touches_the_chains_the_newest_versions_read(tmp_path):
    """With sparse forward deltas at the head, the keyframes their chains start from stay whole
    (every newer chunk there descends from them), and latest reads exactly what it read before."""
    path = str(tmp_path / "r")
    tables = _rows(path, 8)
    repo = Repository(path)
    m = repo.manifest(repo.resolve("latest"))
    chains = {c.chunk_id: repo.index.chunk_closure([c.chunk_id]) for b in m.blobs for c in b.chunks}
    entries = {x: repo.index.entry(x) for cl in chains.values() for x in cl}
    deltackpt.Repo(path).deltify(payback=MECHANICS, lag=1)
    repo = Repository(path)
    assert {x: repo.index.entry(x) for cl in chains.values() for x in cl} == entries
    for k, table in enumerate(reversed(tables)):
        assert torch.equal(deltackpt.load(path, f"latest~{k}")["emb"], table)


def test_frozen_layers_keep_their_keyframes_and_the_trained_layer_is_deltified(tmp_path):
    """A fine-tune that changes one layer: the first version's pack, mostly frozen layers, is
    rewritten without the changed layer's keyframes once they are deltified, so the repository
    stays near forward chains' size."""
    child, parent = str(tmp_path / "child"), str(tmp_path / "parent")
    states = _train(child, 5, frozen=True, deltify=True)
    _train(parent, 5, frozen=True, delta_base="parent")
    assert _pack_bytes(child) < 1.15 * _pack_bytes(parent)
    for k in range(5):
        assert _same(deltackpt.load(child, f"latest~{k}"), states[4 - k])


def test_deltify_is_bounded_and_resumable(tmp_path):
    """max_bytes stops a run after that many keyframe bytes and reports what is left; the next run
    goes on from there; the result equals one unbounded run's."""
    path = str(tmp_path / "r")
    states = _train(path, 6)
    first = deltackpt.Repo(path).deltify(payback=MECHANICS, max_bytes=1)
    assert first.chunks >= 1 and first.remaining > 0
    rest = deltackpt.Repo(path).deltify(payback=MECHANICS)
    assert rest.chunks > 0 and rest.remaining == 0
    assert deltackpt.Repo(path).deltify(payback=MECHANICS).chunks == 0
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
        reports.append(deltackpt.Repo(path).deltify(payback=MECHANICS, lag=ckpt.repo.session.deltify_lag))
    ckpt.close()
    assert ckpt.repo.session.deltify_lag == 3
    assert sum(r.chunks for r in reports) == 0 and sum(r.written_bytes for r in reports) == 0
    assert len(deltackpt.Repo(path).log()) == 3


def test_saves_deltify_inline_and_leave_nothing_running(tmp_path):
    """With deltification on (the default outside the test suite), a save re-stores what it made
    older as reverse deltas before it returns, where that pays back: an embedding table whose rows
    change a few at a time runs forward deltas until their budget is spent, then a keyframe ends
    the period, and that save reverses the period (the first version's keyframe becomes a delta).
    After each save no deltackpt thread is alive, and every version verifies and loads."""
    import subprocess
    import sys
    path = str(tmp_path / "r")
    script = f"""
import os, sys, threading, torch
sys.path.insert(0, {ROOT!r})
import deltackpt
g = torch.Generator().manual_seed(0)
table = torch.randn(16384, 64, generator=g)
for i in range(12):
    if i:
        idx = torch.randint(0, 16384, (2000,), generator=g)
        table[idx] += 0.01 * torch.randn(2000, 64, generator=g)
    deltackpt.save({{"emb": table}}, {path!r}, step=i)
    left = [t.name for t in threading.enumerate() if t.name.startswith("deltackpt")]
    assert not left, left
print("ok")
"""
    env = {**os.environ, "DELTACKPT_DELTIFY": "on"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    repo = Repository(path)
    first = repo.history_order()[-1]
    chunks = [c.chunk_id for b in repo.manifest(first).blobs for c in b.chunks]
    assert all(repo.index.entry(c)[1].base is not None for c in chunks), "the first period was not reversed"
    assert deltackpt.Repo(path).verify().ok and len(deltackpt.Repo(path).log()) == 12


def test_a_folder_removed_right_after_saves_stays_removed(tmp_path, monkeypatch):
    """The most ordinary script: a few ``deltackpt.save(model, path)`` calls, then ``rmtree``.  It
    succeeds every time and nothing re-creates the folder (a background deltifier once kept
    writing into it after the saves returned: 13 of 20 rmtree calls failed, 18 of 20 folders came
    back)."""
    import shutil
    import threading
    import time
    monkeypatch.setenv("DELTACKPT_DELTIFY", "on")
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    paths = []
    for n in range(10):
        path = str(tmp_path / f"r{n}")
        for step in range(4):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            deltackpt.save(model, path, step=step)
        shutil.rmtree(path)   # raises if anything wrote into it meanwhile
        paths.append(path)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("deltackpt")]
    time.sleep(0.5)
    assert not [p for p in paths if os.path.exists(p)], "a removed repository came back"


def test_values_that_come_back_form_no_unreadable_cycle(tmp_path):
    """A tensor that alternates between two values (A, B, A, B, ...) gets copies naming each other as
    bases once deltified; every version still loads, latest stays whole, and gc keeps them
    readable."""
    path = str(tmp_path / "r")
    a, b = torch.randn(512, 1024), torch.randn(512, 1024)
    b[::7] = a[::7]  # similar enough for a delta to pay
    for i in range(6):
        deltackpt.save({"w": (a if i % 2 == 0 else b).clone(), "i": i}, path, step=i)
        deltackpt.Repo(path).deltify(payback=MECHANICS, lag=1)
    repo = Repository(path)
    assert set(_depths(repo, "latest")) == {0}
    for k in range(6):
        got = deltackpt.load(path, f"latest~{k}")
        assert got["i"] == 5 - k and torch.equal(got["w"], a if (5 - k) % 2 == 0 else b)
    deltackpt.Repo(path).gc(keep_last=3)
    for k in range(3):
        assert torch.equal(deltackpt.load(path, f"latest~{k}")["w"], a if (5 - k) % 2 == 0 else b)
    assert deltackpt.Repo(path).verify().ok


def test_a_new_process_deltifies_what_an_earlier_one_saved(tmp_path):
    """A restarted run has none of the earlier chunks in memory: deltify reads them back from the
    repository, and every version of both runs loads."""
    path = str(tmp_path / "r")
    states = _train(path, 3)
    more = _train(path, 3)
    assert deltackpt.Repo(path).deltify(payback=MECHANICS).chunks > 0
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
    _train(path, 3)
    repo = Repository(path)
    assert repo.config.version == 1 and max(_depths(repo, "latest")) >= 1
    with pytest.raises(deltackpt.DeltackptError, match="format-2"):
        deltackpt.Repo(path, delta_base="child")
    assert deltackpt.Repo(path).deltify(payback=MECHANICS).chunks == 0  # no reverse delta in a format-1 repository


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
                assert deltackpt.Repo(path).deltify(payback=MECHANICS, lag=1).chunks > 0
            return out

    store = DeltifyBetweenReads(LocalStore(path))
    report = run_verify(Repository(store))
    assert store.fired and before - set(os.listdir(os.path.join(path, "index")))  # packs were dropped
    assert report.ok, report.to_json()


def test_a_small_change_to_every_element_is_saved_whole_and_reversed_later(tmp_path):
    """At the head a save writes sparse-rows deltas only (head.HEAD_CODEC): a tensor whose every
    element moves a little (what a save every step or two sees) is stored whole at each save, so
    the newest version decodes one object per chunk, not a keyframe and a chain of dense deltas
    each decoded in full.  Deltification then re-stores the older versions as dense reverse deltas
    (the save flags such positions dense for itself, but not as staying whole), so storage keeps
    about what forward deltas cost.  A change to a few rows is still a forward delta."""
    from deltackpt.codecs.registry import SPARSE
    path = str(tmp_path / "r")
    g = torch.Generator().manual_seed(0)
    state = {"dense": torch.randn(8192, 64, generator=g), "rows": torch.randn(8192, 64, generator=g)}
    with deltackpt.Repo(path, create=True, deltify=False) as repo:
        for step in range(4):
            if step:
                state["dense"].mul_(1 + 1e-5 * torch.randn(8192, 64, generator=g))
                state["rows"][torch.randint(0, 8192, (40,), generator=g)] += 0.1
            repo.save(state, step=step)
    repo = Repository(path)
    versions = repo.history_order()   # newest first

    def chunks(vid: str, key: str) -> list[bytes]:
        m = repo.manifest(vid)
        blob = next(t.blob for t in m.tensors if tuple(t.key) == (key,))
        return [c.chunk_id for c in m.blobs[blob].chunks]

    for vid in versions[:-1]:
        assert all(repo.index.entry(c)[1].base is None for c in chunks(vid, "dense")), "a dense forward delta at the head"
        assert all(repo.index.entry(c)[1].encoding == SPARSE for c in chunks(vid, "rows"))
    stored = sum(e.length for es in repo.index.pack_entries.values() for e in es)
    report = deltackpt.Repo(path).deltify(lag=1)
    assert report.chunks > 0
    repo = Repository(path)
    older = [c for vid in versions[1:] for c in chunks(vid, "dense")]
    assert all(repo.index.entry(c)[1].base is not None for c in older), "older versions were not reversed"
    assert sum(e.length for es in repo.index.pack_entries.values() for e in es) < 0.75 * stored
    loaded = deltackpt.load(path)
    assert _same(loaded, state)
    assert deltackpt.Repo(path).verify().ok


def _codec_buffers_held() -> bool:
    """Whether the calling thread holds codec buffers or zstd contexts (codecs/scratch.py)."""
    from deltackpt.codecs import buffers, bytegroup
    return bool(getattr(buffers._local, "buffers", None)) or any(
        name in bytegroup._local.__dict__ for name in ("cctx", "dctx", "planes", "words"))


def test_closing_a_handle_frees_the_codec_buffers_of_the_thread_that_saved(tmp_path):
    """Deltification runs on the thread that called the save, whose codec buffers and zstd
    contexts would outlive the handle: closing it, on that thread, frees them."""
    import threading

    out: dict = {}

    def run() -> None:   # a thread of its own: no earlier test's buffers on it
        g = torch.Generator().manual_seed(0)
        table = torch.randn(4096, 64, generator=g)
        with deltackpt.Repo(str(tmp_path / "repo"), create=True) as repo:
            for step in range(10):
                table[torch.randint(0, 4096, (20,), generator=g)] += 0.01
                repo.save({"emb": table}, step=step)
                repo.deltify()
            out["while_open"] = _codec_buffers_held()
        out["after_close"] = _codec_buffers_held()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out == {"while_open": True, "after_close": False}


def test_closing_a_handle_frees_the_work_words_of_two_plane_dtypes(tmp_path, monkeypatch):
    """Without the compiled loops, bfloat16 planes are interleaved by numpy in work arrays the
    thread keeps (bytegroup._words, 2 MiB each); closing the handle frees them with the rest (they
    outlived it before stop 44)."""
    import threading

    from deltackpt.codecs import bytegroup, native_planes
    monkeypatch.setattr(native_planes, "_planes", None)
    out: dict = {}

    def run() -> None:   # a thread of its own: no earlier test's buffers on it
        g = torch.Generator().manual_seed(0)
        state = {f"t{i}": (torch.randn(1 << 18, generator=g) * 0.02).bfloat16() for i in range(8)}
        with deltackpt.Repo(str(tmp_path / "repo"), create=True) as repo:
            for v in range(3):
                for t in state.values():
                    t[v * 100:(v + 1) * 100] += 1
                repo.save(state, step=v)
            loaded = repo.load()
            out["words_while_open"] = "words" in bytegroup._local.__dict__
        out["after_close"] = _codec_buffers_held()
        out["same"] = all(torch.equal(loaded[k], t) for k, t in state.items())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out == {"words_while_open": True, "after_close": False, "same": True}


def test_a_blocking_save_frees_the_codec_buffers_its_deltification_used(tmp_path):
    """The bounded deltification step a save runs after its commit decodes and encodes on the
    caller's thread; when the save returns, that thread keeps none of the buffers (about 9 MiB on
    MiniLM, kept between saves before stop 42)."""
    import threading

    out: dict = {"held": [], "re_stored": 0}

    def run() -> None:   # a thread of its own: no earlier test's buffers on it
        g = torch.Generator().manual_seed(0)
        table = torch.randn(4096, 64, generator=g)
        with deltackpt.Repo(str(tmp_path / "repo"), create=True, deltify=True) as repo:
            for step in range(12):
                table[torch.randint(0, 4096, (200,), generator=g)] += 0.01  # keyframes: a period to re-store
                repo.save({"emb": table}, step=step)
                out["held"].append(_codec_buffers_held())
                report = repo.session.last_maintenance
                out["re_stored"] += getattr(report, "chunks", 0)
            out["state"] = table.clone()
        out["loaded"] = deltackpt.load(str(tmp_path / "repo"))["emb"]

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out["re_stored"] > 0, "no save ran a deltification step: the test would prove nothing"
    assert out["held"] == [False] * 12
    assert torch.equal(out["loaded"], out["state"])
