"""Live rollback: restore() into a model that holds a nearby version reads only what differs,
and the result is the target version bit for bit."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import deltackpt
from deltackpt.errors import CorruptObjectError, InvalidArgumentError
from deltackpt.torchstate import materialize
from deltackpt.repo.layout import pack_key
from deltackpt.store import CountingStore, LocalStore
from tests.strategies import assert_bit_identical, clone_state


@pytest.fixture(params=["child", "parent"])
def topology(request) -> str:
    """Reverse deltas, once deltified (a rollback applies the target's deltas onto the live chunk),
    and forward chains (it undoes the live chunk's own deltas)."""
    return request.param


@pytest.fixture
def repo_path(tmp_path, topology) -> str:
    path = str(tmp_path / "repo")
    deltackpt.Repo.init(path, delta_base=topology)
    return path


#: deltification's payback for these tests: rewrite what saves at least 5% (see tests/repo/test_deltify.py)
MECHANICS = 0.05


def _expected(repo: deltackpt.Repo, topology: str, live_rev: str, target_rev: str) -> int:
    return (_expected_rollback_bytes if topology == "parent" else _expected_forward_bytes)(repo, live_rev, target_rev)


def _stepped(topology: str) -> int:
    """Chunks moved by the route a rollback takes in this topology."""
    return _stats().inverse if topology == "parent" else _stats().forward


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(32, 64, generator=g)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def _history(path: str, versions: int = 4, freeze: str | None = None):
    """A model + AdamW trained and saved ``versions`` times; returns them and each saved state."""
    model = _mlp()
    if freeze is not None:
        for name, p in model.named_parameters():
            p.requires_grad_(not name.startswith(freeze))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    saved = []
    for step in range(versions):
        _train(model, opt, step)
        deltackpt.save(_state(model, opt), path, step=step)
        saved.append(clone_state(_state(model, opt)))
    # every version but the newest as reverse deltas (saves leave that to deltification; these dense
    # changes only pay back at a low payback, MECHANICS, which the tests of the live mechanics ask for)
    with deltackpt.Repo(path) as repo:
        repo.deltify(lag=1, payback=MECHANICS)
    return model, opt, saved


def _stats():
    """The live-restore counters of this process."""
    from deltackpt.repo.read import live
    return live.stats


def _counting(path: str) -> tuple[deltackpt.Repo, CountingStore]:
    store = CountingStore(LocalStore(path))
    return deltackpt.Repo(store), store


def _restore(repo: deltackpt.Repo, store: CountingStore, model, opt, rev: str) -> int:
    """Restore and return the pack bytes it read."""
    repo.core.index.refresh()
    store.reset()
    if "deltackpt.repo.read.live" in sys.modules:
        _stats().reset()
    deltackpt.restore(model, repo, rev, optimizer=opt)
    return store.bytes_read_under("packs/")


def _chunks(repo: deltackpt.Repo, rev: str) -> dict[str, list[bytes]]:
    m = repo.core.manifest(repo.core.resolve(rev))
    return {t.name: [c.chunk_id for c in m.blobs[t.blob].chunks] for t in m.tensors}


def _expected_rollback_bytes(repo: deltackpt.Repo, live_rev: str, target_rev: str) -> int:
    """Pack bytes a live restore needs: nothing for a chunk the model holds, the live chunk's own
    delta where its base is the target chunk and it is smaller than the target's chain, a full
    read of that chain otherwise."""
    core, total = repo.core, 0
    held = _chunks(repo, live_rev)
    whole: set[bytes] = set()   # a chunk read whole is read once, however many tensors hold it
    for name, ids in _chunks(repo, target_rev).items():
        for cid, lid in zip(ids, held[name]):
            if cid == lid:
                continue
            e, full = core.index.entries_for(lid)[0][1], core.index.stored_size(core.index.chunk_closure([cid]))
            if e.base == cid and e.encoding in (2, 3, 4) and e.length < full:
                total += e.length
            elif cid not in whole:
                whole.add(cid)
                total += full
    return total


def _expected_forward_bytes(repo: deltackpt.Repo, live_rev: str, target_rev: str) -> int:
    """Pack bytes a live roll-forward needs: per chunk, the target chain's deltas above the chunk
    the model holds, when they are fewer bytes than the whole chain."""
    core, total = repo.core, 0
    held = _chunks(repo, live_rev)
    whole: set[bytes] = set()   # a chunk read whole is read once, however many tensors hold it
    for name, ids in _chunks(repo, target_rev).items():
        for cid, lid in zip(ids, held[name]):
            above, cur, full = 0, cid, core.index.stored_size(core.index.chunk_closure([cid]))
            while cur is not None and cur != lid:
                e = core.index.entries_for(cur)[0][1]
                above, cur = above + e.length, e.base
            if cur == lid and above < full:
                total += above
            elif cid not in whole:
                whole.add(cid)
                total += full
    return total


def test_rollback_by_one_reads_only_the_live_chunks_deltas(repo_path, topology):
    """Rolling back one version steps the live chunks in place (forward chains: undoing their own
    deltas; reverse deltas: applying the target's delta against them): bit-identical, and the pack
    bytes read are exactly those deltas (plus full reads where no delta path exists)."""
    model, opt, saved = _history(repo_path)
    repo, store = _counting(repo_path)
    expected = _expected(repo, topology, "latest", "latest~1")
    read = _restore(repo, store, model, opt, "latest~1")
    assert_bit_identical(_state(model, opt), saved[-2])
    assert read == expected
    assert _stepped(topology) > 0
    fresh = _mlp(seed=1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    assert _restore(repo, store, fresh, fresh_opt, "latest~1") > read  # a cold restore reads the chains


def test_rollback_by_two_then_forward_is_bit_identical(repo_path, topology):
    """Rolling back two versions, then forward to the newest, gives each version's exact bytes; the
    step that follows the stored deltas' direction reads exactly those deltas."""
    model, opt, saved = _history(repo_path)
    repo, store = _counting(repo_path)
    expected_back = _expected_forward_bytes(repo, "latest", "latest~2")
    back = _restore(repo, store, model, opt, "latest~2")
    assert_bit_identical(_state(model, opt), saved[-3])
    read = _restore(repo, store, model, opt, "latest")
    assert_bit_identical(_state(model, opt), saved[-1])
    if topology == "parent":
        assert read == _expected_forward_bytes(repo, "latest~2", "latest")
        assert _stats().forward > 0
    else:  # two reverse deltas undone cost more than the newest's keyframes: read whole
        assert back == expected_back
        assert read <= repo.core.index.stored_size(c for ids in _chunks(repo, "latest").values() for c in ids)


def test_restoring_the_version_the_model_holds_reads_no_chunk(repo_path):
    """Every chunk of a model already at the target hashes equal: no pack byte is read."""
    model, opt, saved = _history(repo_path, versions=2)
    repo, store = _counting(repo_path)
    assert _restore(repo, store, model, opt, "latest") == 0
    assert_bit_identical(_state(model, opt), saved[-1])
    assert _stats().full == 0 and _stats().unchanged > 0


def test_frozen_layers_are_neither_read_nor_written(repo_path, topology):
    """With the first layer frozen, a rollback reads only the trained layer's deltas."""
    model, opt, saved = _history(repo_path, freeze="0.")
    repo, store = _counting(repo_path)
    frozen = [n for n in _chunks(repo, "latest") if n.startswith("model.0.")]
    assert frozen
    read = _restore(repo, store, model, opt, "latest~1")
    assert_bit_identical(_state(model, opt), saved[-2])
    assert read == _expected(repo, topology, "latest", "latest~1")
    assert _stats().unchanged >= len(frozen)
    held, target = _chunks(repo, "latest"), _chunks(repo, "latest~1")
    assert all(held[n] == target[n] for n in frozen)  # the premise: frozen chunks did not change


@pytest.mark.parametrize("how", ["corrupted live memory", "different model"])
def test_a_live_tensor_that_does_not_match_is_read_in_full(repo_path, how):
    """Live bytes that hash to no stored chunk are never used as a base: a full read, bit-identical."""
    model, opt, saved = _history(repo_path)
    if how == "different model":
        model = _mlp(seed=7)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, opt, 99)
    else:
        with torch.no_grad():
            model[0].weight[3, 5] += 1.0
    repo, store = _counting(repo_path)
    _restore(repo, store, model, opt, "latest~1")
    assert_bit_identical(_state(model, opt), saved[-2])
    assert _stats().full > 0


def _corrupt(path: str, repo: deltackpt.Repo, cid: bytes) -> None:
    """Flip a byte in the middle of a chunk's stored object (a delta's low byte planes are often
    stored raw there, so it still decodes: only the hash check can tell)."""
    pid, e = repo.core.index.entries_for(cid)[0]
    f = os.path.join(path, pack_key(pid))
    os.chmod(f, 0o644)
    with open(f, "r+b") as fh:
        fh.seek(e.offset + e.length // 2)
        b = fh.read(1)
        fh.seek(e.offset + e.length // 2)
        fh.write(bytes([b[0] ^ 0x5A]))


def test_a_corrupt_delta_of_the_target_raises_naming_version_and_tensor(repo_path, topology):
    """Stepping the live chunk over a corrupt delta of the target's chain raises CorruptObjectError
    (forward chains: rolling forward to latest; reverse deltas: rolling back to latest~1)."""
    model, opt, saved = _history(repo_path)
    repo, store = _counting(repo_path)
    target = "latest" if topology == "parent" else "latest~1"
    if topology == "parent":
        _restore(repo, store, model, opt, "latest~1")
    vid = repo.core.resolve(target)
    _corrupt(repo_path, repo, _chunks(repo, target)["model.0.weight"][0])
    with pytest.raises(CorruptObjectError, match=rf"version {vid[:10]}.*model\.0\.weight"):
        _restore(repo, store, model, opt, target)


@pytest.mark.parametrize("topology", ["parent"])  # the live version's own deltas: forward chains
def test_a_corrupt_delta_of_the_live_version_falls_back_to_a_full_read(repo_path):
    """A live chunk's own delta (another version's data) that fails its hash check is not used:
    the target, intact, is read in full and restored bit-identically."""
    model, opt, saved = _history(repo_path)
    repo, store = _counting(repo_path)
    _corrupt(repo_path, repo, _chunks(repo, "latest")["model.0.weight"][0])
    _restore(repo, store, model, opt, "latest~1")
    assert_bit_identical(_state(model, opt), saved[-2])
    assert _stats().full > 0


def test_adamw_state_is_restored_into_its_own_tensors(repo_path):
    """The optimizer's existing state tensors receive the version in place (same storage)."""
    model, opt, saved = _history(repo_path)
    before = {(p, k): v.data_ptr() for p, s in opt.state_dict()["state"].items() for k, v in s.items()}
    repo, store = _counting(repo_path)
    _restore(repo, store, model, opt, "latest~2")
    after = {(p, k): v.data_ptr() for p, s in opt.state_dict()["state"].items() for k, v in s.items()}
    assert after == before
    assert_bit_identical(_state(model, opt), saved[-3])
    _train(model, opt, 2)  # the optimizer steps on from the restored state as it did then
    assert_bit_identical(_state(model, opt), saved[-2])


def test_tied_weights_are_stepped_once(repo_path, topology):
    """Two parameters sharing one tensor are one destination: stepped in place once (a second,
    concurrent step over the same memory would see half-written bytes), bit-identical."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(100, 32)
    head = torch.nn.Linear(32, 100, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    saved = []
    for step in range(3):
        with torch.no_grad():
            emb.weight.add_(torch.randn(100, 32, generator=torch.Generator().manual_seed(step)) * 1e-3)
        deltackpt.save(model, repo_path)
        saved.append(clone_state(model.state_dict()))
    with deltackpt.Repo(repo_path) as repo:
        repo.deltify(lag=1, payback=MECHANICS)
    if "deltackpt.repo.read.live" in sys.modules:
        _stats().reset()
    deltackpt.restore(model, repo_path, "latest~1", threads=1)
    assert_bit_identical(model.state_dict(), saved[1])
    assert model["head"].weight is model["emb"].weight
    assert (_stepped(topology), _stats().unchanged, _stats().full) == (1, 0, 0)


def test_an_optimizer_state_shared_by_two_parameters_is_restored_through_one(repo_path):
    """Two parameters whose momentum buffers are one tensor: the buffer is decoded in place once
    and both parameters' states are that tensor again (this raised KeyError before stop 39)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    first, second = model[0].weight, model[1].weight
    opt.state[second]["momentum_buffer"] = buffer = opt.state[first]["momentum_buffer"]
    deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, repo_path)
    saved = buffer.clone()
    buffer.add_(1)
    deltackpt.restore(model, repo_path, optimizer=opt)
    assert opt.state[first]["momentum_buffer"] is buffer and opt.state[second]["momentum_buffer"] is buffer
    assert torch.equal(buffer, saved)


def test_read_threads_default_to_every_core_and_can_be_set(monkeypatch):
    """The read pool uses every core this process may run on, $DELTACKPT_READ_THREADS or threads=."""
    monkeypatch.delenv(materialize.THREADS_ENV, raising=False)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert materialize.read_threads() == cores
    with materialize.pool() as p:
        assert p._max_workers == cores
    monkeypatch.setenv(materialize.THREADS_ENV, "3")
    assert materialize.read_threads() == 3
    assert materialize.read_threads(5) == 5
    monkeypatch.setenv(materialize.THREADS_ENV, "many")
    with pytest.raises(InvalidArgumentError, match=materialize.THREADS_ENV):
        materialize.read_threads()


def test_bad_threads_are_refused_before_anything_is_written(repo_path):
    """restore(threads=0) raises InvalidArgumentError and leaves the model as it was."""
    model, opt, saved = _history(repo_path, versions=2)
    with pytest.raises(InvalidArgumentError):
        deltackpt.restore(model, repo_path, "latest~1", threads=0)
    assert_bit_identical(_state(model, opt), saved[-1])
    deltackpt.restore(model, repo_path, "latest~1", optimizer=opt, threads=1)
    assert_bit_identical(_state(model, opt), saved[-2])
    assert_bit_identical(deltackpt.load(repo_path, "latest", threads=2)["model"], saved[-1]["model"])


def test_resume_rolls_back_reading_only_what_differs_and_stays_all_or_nothing(repo_path, topology):
    """resume(version=...) into the live model and optimizer reads only what differs from what they
    hold (their tensors seed fresh buffers), lands bit-identical, and a version that fails to load
    leaves them untouched."""
    from deltackpt.training import resume

    model, opt, saved = _history(repo_path)
    repo, store = _counting(repo_path)
    store.reset()
    resume(repo, model=model, optimizer=opt, version="latest~1", restore_rng=False)
    near = store.bytes_read_under("packs/")
    assert_bit_identical(_state(model, opt), saved[-2])
    fresh, fresh_opt = _mlp(seed=1), None
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    store.reset()
    resume(repo, model=fresh, optimizer=fresh_opt, version="latest~1", restore_rng=False)
    assert near < 0.8 * store.bytes_read_under("packs/")  # a fresh model matches nothing
    # a model that matches nothing reads the corrupt chunk (a nearby one might step around it)
    other = _mlp(seed=5)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    _train(other, other_opt, 7)
    before = clone_state(_state(other, other_opt))
    vid = repo.core.resolve("latest")  # a named version is restored or raises ("latest" would fall back)
    _corrupt(repo_path, repo, _chunks(repo, "latest")["model.2.weight"][0])
    with pytest.raises(CorruptObjectError):
        resume(repo, model=other, optimizer=other_opt, version=vid, restore_rng=False)
    assert_bit_identical(_state(other, other_opt), before)
