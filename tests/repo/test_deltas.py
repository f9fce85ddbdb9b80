"""Deltas, keyframes and bounded chains on real repositories with a real model and optimizer."""

from __future__ import annotations

import torch

import deltackpt
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
    return [e.depth for _cid, _pid, e in repo.core.index.items()]


def test_second_save_is_stored_as_deltas(tmp_path):
    """The first save is keyframes; the next, after training, uses delta codecs and writes fewer bytes
    than the same state saved as keyframes into an empty repository."""
    repo_path = str(tmp_path / "repo")
    deltackpt.Repo.init(repo_path, delta_base="parent")  # forward chains are what this pins
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
    deltackpt.Repo.init(repo_path, keyframe_interval=3, delta_base="parent")  # forward chains
    step = _trainer()
    for _ in range(9):
        deltackpt.save(step(2), repo_path)
    depths = _depths(deltackpt.Repo(repo_path))
    assert max(depths) == 3 and 0 in depths


def _assert_pack_reads_per_chunk(path: str, saved: list, most: int) -> None:
    """Each saved (version, state) loads bit-identically in a fresh reader that reads at most
    ``most`` pack objects per chunk of the version."""
    for v, state in saved:
        store = CountingStore(LocalStore(path))
        repo = deltackpt.Repo(store)
        chunks = sum(len(b.chunks) for b in repo.core.manifest(v.id).blobs)
        store.reset()
        assert_bit_identical(state, deltackpt.load(repo, v.id))
        pack_reads = sum(1 for key in store.keys_read if key.startswith("packs/"))
        assert pack_reads <= most * chunks, (v.id, pack_reads, chunks)


def test_restoring_any_version_decodes_at_most_k_plus_one_objects_per_chunk(tmp_path):
    """A fresh reader of any version reads <= K+1 objects per chunk from the packs, bit-identically."""
    k = 3
    path = str(tmp_path / "repo")
    deltackpt.Repo.init(path, keyframe_interval=k, delta_base="parent")  # forward chains (reverse: test_reverse_deltas)
    step = _trainer()
    saved = [(deltackpt.save(s, path), s) for s in (step(2) for _ in range(7))]
    _assert_pack_reads_per_chunk(path, saved, k + 1)
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
    repo.deltify(lag=1, payback=0.05)  # older versions become reverse chains (deltas saving 5% are enough)
    repo.tag("mid", saved[3][0].id)
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert report.chunks_rebased > 0
    for v, state in (saved[3], saved[5]):
        assert_bit_identical(state, deltackpt.load(repo_path, v.id))
    assert deltackpt.Repo(repo_path).verify().ok
    # the chain after gc is still bounded and a new save continues from the cache-less handle
    deltackpt.save(step(2), repo_path)
    assert max(_depths(deltackpt.Repo(repo_path))) <= 8


def _positions(repo: deltackpt.Repo) -> dict[tuple[int, int], list]:
    """Per (blob, chunk) position, the index entry of that chunk in each version, oldest first."""
    core = repo.core
    out: dict[tuple[int, int], list] = {}
    for vid in reversed(core.history()):
        for bi, blob in enumerate(core.manifest(vid).blobs):
            for ci, c in enumerate(blob.chunks):
                out.setdefault((bi, ci), []).append(core.index.entry(c.chunk_id)[1])
    return out


def test_star_deltas_are_taken_against_their_keyframe(repo_path):
    """With delta_base="keyframe" and K=3, every lossless delta is taken against its position's last
    keyframe (depth 1, never deeper), and a position gets a new keyframe after at most 3 deltas."""
    deltackpt.Repo.init(repo_path, keyframe_interval=3, delta_base="keyframe")
    step = _trainer()
    for _ in range(9):
        deltackpt.save(step(2), repo_path)
    repo = deltackpt.Repo(repo_path)
    depths = _depths(repo)
    assert max(depths) == 1 and 0 in depths
    runs = []
    for entries in _positions(repo).values():
        keyframe, run = None, 0
        for e in entries:
            if e.depth == 0:
                keyframe, run = e.chunk_id, 0
            elif e.chunk_id != keyframe:  # (an unchanged chunk repeats its entry)
                assert e.base == keyframe, "a delta's base is its position's last keyframe"
                run += 1
                assert run <= 3
                runs.append(run)
    assert 3 in runs


def test_star_restores_any_version_from_at_most_two_objects_per_chunk(tmp_path):
    """With delta_base="keyframe" and K=8, a fresh reader of any version reads <= 2 objects per
    chunk from the packs (the keyframe and one delta), bit-identically; the config remembers the
    choice for a later handle."""
    path = str(tmp_path / "repo")
    deltackpt.Repo.init(path, keyframe_interval=8, delta_base="keyframe")
    assert deltackpt.Repo(path).core.config.delta_base == "keyframe"
    step = _trainer()
    saved = [(deltackpt.save(s, path), s) for s in (step(2) for _ in range(10))]
    _assert_pack_reads_per_chunk(path, saved, 2)
    assert max(_depths(deltackpt.Repo(path))) == 1


def test_star_keeps_lossy_deltas_on_the_decoded_parent(repo_path):
    """With delta_base="keyframe", q8 deltas still chain on the decoded previous version (error does
    not accumulate), so their depth grows by one per save, unlike lossless deltas."""
    deltackpt.Repo.init(repo_path, keyframe_interval=4, delta_base="keyframe")
    step = _trainer()
    for _ in range(4):
        deltackpt.save(step(2), repo_path, encoding={"optimizer.*": "q8-delta"})
    repo = deltackpt.Repo(repo_path)
    assert max(_depths(repo)) == 3
    assert max(e.depth for e in _positions(repo)[(0, 0)]) <= 1  # a model tensor: lossless


def test_gc_keeps_the_keyframe_under_a_kept_star_delta(repo_path):
    """gc that removes the keyframe version under the only kept star delta keeps that keyframe as
    its base (re-encoding the delta whole would write a keyframe to save a delta's bytes); the kept
    version still loads, and new saves form a star again."""
    deltackpt.Repo.init(repo_path, keyframe_interval=8, delta_base="keyframe")
    step = _trainer()
    saved = [(deltackpt.save(s, repo_path), s) for s in (step(2) for _ in range(6))]
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert report.chunks_rebased == 0 and report.bases_kept > 0
    assert_bit_identical(saved[5][1], deltackpt.load(repo_path, saved[5][0].id))
    repo = deltackpt.Repo(repo_path)
    assert repo.verify().ok and max(_depths(repo)) <= 1
    deltackpt.save(step(2), repo_path)
    deltackpt.save(step(2), repo_path)
    assert max(_depths(deltackpt.Repo(repo_path))) <= 1


def test_gc_keeps_a_keyframe_that_several_kept_deltas_share(repo_path):
    """When two kept versions are star deltas against the same removed version's keyframe, gc keeps
    that keyframe (reported in bases_kept) instead of rebasing both; every kept version still
    loads, and every kept delta's base is still indexed."""
    deltackpt.Repo.init(repo_path, keyframe_interval=8, delta_base="keyframe")
    step = _trainer()
    saved = [(deltackpt.save(s, repo_path), s) for s in (step(2) for _ in range(6))]
    repo = deltackpt.Repo(repo_path)
    repo.tag("mid", saved[3][0].id)
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert len(report.removed) == 4 and report.bases_kept > 0
    repo = deltackpt.Repo(repo_path)
    for _cid, _pid, e in repo.core.index.items():
        assert e.base is None or repo.core.index.has_chunk(e.base)
    for v, state in (saved[3], saved[5]):
        assert_bit_identical(state, deltackpt.load(repo_path, v.id))
    assert repo.verify().ok and max(_depths(repo)) <= 1


def test_a_delta_position_remembers_its_codec_and_the_next_save_reuses_it(tmp_path):
    """Sampling the delta codecs runs once per chain: the delta cache records the codec each position
    was stored with, and the next save through the same handle encodes that position with it."""
    from deltackpt.codecs.registry import get
    deltackpt.Repo.init(str(tmp_path / "repo"), delta_base="parent")  # every change a delta
    repo = deltackpt.Repo(str(tmp_path / "repo"))
    step = _trainer()
    repo.save(step(20))
    repo.save(step(5))
    winners = {k: m.winner for k, m in repo.session.delta_cache._items.items() if m.winner is not None}
    assert winners and {get(w).name for w in winners.values()} <= DELTA_CODECS
    repo.save(step(5))
    after = repo.session.delta_cache._items
    still = [k for k in winners if after[k].winner is not None]
    assert still and all(after[k].winner == winners[k] for k in still)


def test_a_star_position_remembers_its_codec_while_its_keyframe_stays_the_base(tmp_path):
    """With delta_base="keyframe" the memo of a position stays its keyframe (one older per delta);
    the codec its last delta was stored with is remembered all the same, so star saves skip the
    sampling too."""
    from deltackpt.codecs.registry import get
    path = str(tmp_path / "repo")
    deltackpt.Repo.init(path, keyframe_interval=8, delta_base="keyframe")
    repo = deltackpt.Repo(path)
    step = _trainer()
    repo.save(step(20))
    repo.save(step(5))
    items = repo.session.delta_cache._items
    winners = {k: m.winner for k, m in items.items() if m.winner is not None}
    assert winners and {get(w).name for w in winners.values()} <= DELTA_CODECS
    assert all(items[k].depth == 0 and items[k].age == 1 for k in winners), "the keyframe stays the base"
