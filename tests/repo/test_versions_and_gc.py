"""Revisions, tags and gc on real repositories."""

from __future__ import annotations

import os

import pytest
import torch

import deltackpt
from tests.strategies import assert_bit_identical


def _save_series(path: str, n: int, **kw) -> list:
    out = []
    for i in range(n):
        state = {"w": torch.full((64, 64), float(i)), "b": torch.arange(10) * i, "step": i}
        out.append((deltackpt.save(state, path, step=i, metrics={"loss": 10.0 - i}, **kw), state))
    return out


def test_revisions_resolve_ids_prefixes_tags_and_ancestors(repo_path):
    """latest, latest~N, full ids, 4+ character prefixes and tags name the right versions."""
    series = _save_series(repo_path, 4)
    repo = deltackpt.Repo(repo_path)
    assert repo.resolve("latest").id == series[-1][0].id
    assert repo.resolve("latest~3").id == series[0][0].id
    assert repo.resolve(series[1][0].id[:8]).id == series[1][0].id
    repo.tag("good", series[1][0].id)
    assert repo.resolve("good").id == series[1][0].id
    assert repo.resolve("good~1").id == series[0][0].id
    assert repo.resolve("best:loss").id == series[-1][0].id
    assert repo.resolve("best:loss:max").id == series[0][0].id
    assert_bit_identical(series[2][1], deltackpt.load(repo_path, "latest~1"))


@pytest.mark.parametrize("rev", ["latest~9", "nosuchtag", "abc", "0000ffff", "latest~x", "best:nometric"])
def test_unknown_revisions_raise_unknown_version_error(repo_path, rev):
    """Revisions naming nothing raise UnknownVersionError (a KeyError) with the revision in the message."""
    _save_series(repo_path, 2)
    with pytest.raises(deltackpt.UnknownVersionError) as info:
        deltackpt.load(repo_path, rev)
    assert isinstance(info.value, KeyError)


def test_tags_refuse_bad_names_and_duplicates(repo_path):
    """Tag names with separators or traversal are InvalidNameError; an existing tag is a ConflictError."""
    _save_series(repo_path, 1)
    repo = deltackpt.Repo(repo_path)
    for bad in ["../x", "a/b", "", ".hidden", "x" * 200, "latest"]:
        with pytest.raises(deltackpt.InvalidNameError):
            repo.tag(bad)
    repo.tag("v1")
    with pytest.raises(deltackpt.ConflictError):
        repo.tag("v1")
    repo.tag("v1", force=True)
    repo.untag("v1")
    assert "v1" not in repo.tags()


def test_save_with_taken_tag_commits_nothing(repo_path):
    """save(tag=...) with a taken tag raises ConflictError and leaves latest where it was."""
    series = _save_series(repo_path, 1, tag=None)
    deltackpt.Repo(repo_path).tag("x")
    with pytest.raises(deltackpt.ConflictError):
        deltackpt.save({"w": torch.ones(3)}, repo_path, tag="x")
    assert deltackpt.Repo(repo_path).resolve("latest").id == series[0][0].id


def test_gc_keeps_last_tags_and_latest_and_everything_kept_restores(repo_path):
    """gc --keep-last 2 keeps the last two and tagged versions; each kept one restores bit-identically."""
    series = _save_series(repo_path, 6)
    repo = deltackpt.Repo(repo_path)
    repo.tag("first", series[0][0].id)
    dry = deltackpt.gc(repo_path, keep_last=2, dry_run=True)
    assert len(repo.log()) == 6 and len(dry.removed) == 3
    report = deltackpt.gc(repo_path, keep_last=2, grace_seconds=0)
    assert sorted(report.removed) == sorted(v.id for v, _ in series[1:4])
    assert report.reclaimed_bytes > 0
    kept = {v.id for v in repo.log()}
    assert kept == {series[0][0].id, series[4][0].id, series[5][0].id}
    for v, state in series:
        if v.id in kept:
            assert_bit_identical(state, deltackpt.load(repo_path, v.id))
    assert repo.verify().ok


def test_gc_never_breaks_a_delta_chain_of_a_kept_version(repo_path):
    """Versions stored as deltas stay restorable after gc removes their bases (rebase or keep bases)."""
    deltackpt.Repo.init(repo_path, delta_base="parent")  # forward chains are what this pins
    torch.manual_seed(0)
    w = torch.randn(512, 256)
    states = []
    for i in range(5):
        w = w + 1e-3 * torch.randn_like(w)
        states.append({"w": w.clone()})
        deltackpt.save(states[-1], repo_path)
    repo = deltackpt.Repo(repo_path)
    assert repo.show()["written"]["encodings"]  # the later versions are deltas
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert report.chunks_rebased >= 1
    assert_bit_identical(states[-1], deltackpt.load(repo_path))
    assert repo.verify().ok


def test_gc_keep_bases_mode_keeps_the_chain(tmp_path):
    """With rebase=False gc keeps the delta bases a kept version needs and reports them."""
    path = str(tmp_path / "r")
    deltackpt.Repo.init(path, delta_base="parent")  # forward chains are what this pins
    w = torch.randn(512, 256)
    for i in range(4):
        w = w + 1e-3
        deltackpt.save({"w": w.clone()}, path)
    report = deltackpt.gc(path, keep_last=1, rebase=False, grace_seconds=0)
    assert report.bases_kept >= 1
    assert torch.equal(deltackpt.load(path)["w"], w)


def test_gc_retention_rules_union(repo_path):
    """keep_best and keep_every add to keep_last: the union is kept."""
    series = _save_series(repo_path, 6)
    report = deltackpt.gc(repo_path, keep_last=1, keep_best="loss:1:max", keep_every=4, dry_run=True)
    kept = set(report.kept)
    assert series[0][0].id in kept           # best by max loss (and step 0 of every-4)
    assert series[4][0].id in kept           # step 4 starts the second bucket of 4
    assert series[5][0].id in kept           # last
    assert len(kept) == 3


def test_a_reader_with_a_stale_index_survives_gc_repacking(repo_path):
    """A handle whose index predates a gc in another handle still loads the kept version (re-reads the index)."""
    import deltackpt.repo.repository as repository
    deltackpt.Repo.init(repo_path, delta_base="parent")  # forward chains are what this pins
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    for _ in range(3):
        w = w + 1e-3 * torch.randn_like(w)
        deltackpt.save({"w": w}, repo_path)  # deltas against the previous version
    stale = repository.Repository(repo_path)  # loads the index now
    m = stale.manifest(stale.latest())
    before = stale.index.entry(m.blobs[0].chunks[0].chunk_id)[0]
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)  # rebases the delta: its pack is replaced
    assert report.chunks_rebased == 1
    assert not os.path.exists(os.path.join(repo_path, "packs", before[:2], before))
    assert bytes(stale.chunks.read_blob(m.blobs[0])) == w.numpy().tobytes()
