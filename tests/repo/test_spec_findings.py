"""Regressions for defects found while writing the spec (spec/FORMAT.md, appendix)."""

from __future__ import annotations

import os

import pytest
import torch

import deltackpt
from deltackpt.format import index as index_fmt
from deltackpt.format.ids import hex_id
from deltackpt.format.manifest import Blob, ChunkRef, Manifest, TensorEntry, TensorRef
from deltackpt.repo.repository import Repository


def _loads_before_and_after_gc(repo_path: str, expected: torch.Tensor) -> None:
    """A fresh handle loads ``expected``; after gc (keep the latest) too; and the repository verifies."""
    deltackpt.frontend.api._OPEN.clear()
    assert torch.equal(deltackpt.load(repo_path)["w"], expected)
    deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    deltackpt.frontend.api._OPEN.clear()
    assert torch.equal(deltackpt.load(repo_path)["w"], expected)
    assert deltackpt.Repo(repo_path).verify().ok


def test_an_index_file_naming_a_missing_pack_neither_hides_the_chunk_nor_makes_gc_drop_it(repo_path):
    """A stale index entry (a pack that is gone) sorting first: load uses the good copy, gc keeps it."""
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 64)}
    deltackpt.save(state, repo_path, step=0)
    items = Repository(repo_path).index_items()
    plen = max(e.offset + e.length for _, _, e in items) + 20
    with open(os.path.join(repo_path, "index", "0" * 32), "wb") as f:  # sorts before the real index file
        f.write(index_fmt.encode({"0" * 32: (plen, [e for _, _, e in items])}))
    _loads_before_and_after_gc(repo_path, state["w"])


def test_gc_stops_before_deleting_when_a_live_chunk_is_in_no_pack(repo_path):
    """If a kept version's chunk exists nowhere, gc raises CorruptObjectError and removes nothing."""
    deltackpt.save({"w": torch.randn(64, 64)}, repo_path)
    deltackpt.save({"w": torch.randn(64, 64)}, repo_path)
    repo = deltackpt.Repo(repo_path)
    pid, _ = repo.core.entry(repo.core.manifest(repo.core.resolve("latest")).blobs[0].chunks[0].chunk_id)
    os.unlink(os.path.join(repo_path, "packs", pid[:2], pid))
    before = sorted(os.listdir(os.path.join(repo_path, "manifests")))
    with pytest.raises(deltackpt.CorruptObjectError, match="stopped before deleting"):
        deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert sorted(os.listdir(os.path.join(repo_path, "manifests"))) == before


@pytest.mark.parametrize("name", ["abcd", "deadbeef", "0123456789abcdef0123456789abcdef"])
def test_tags_that_look_like_version_ids_are_refused(repo_path, name):
    """A tag of 4+ lowercase hex digits would shadow id prefixes, so it is an InvalidNameError."""
    deltackpt.save({"w": torch.zeros(2)}, repo_path)
    with pytest.raises(deltackpt.InvalidNameError, match="shadow"):
        deltackpt.Repo(repo_path).tag(name)


def test_a_manifest_declaring_an_impossible_blob_is_a_typed_error(repo_path):
    """A small manifest declaring a 64 TiB tensor makes load raise a typed error, never a bare MemoryError."""
    deltackpt.save({"w": torch.zeros(4)}, repo_path)
    m = Manifest(parent=None, time=1.0, tree={"w": TensorRef(0)},
                 tensors=[TensorEntry("w", ["w"], "float32", [1 << 44], [1], 0, 0)],
                 blobs=[Blob(1 << 46, 4, 4, [ChunkRef(bytes(16), 1 << 26)] * (1 << 20))])
    data = m.to_bytes()
    vid = hex_id(data)
    with open(os.path.join(repo_path, "manifests", vid), "wb") as f:
        f.write(data)
    with pytest.raises(deltackpt.DeltackptError) as info:  # refused before allocating (chunks not backed)
        deltackpt.load(repo_path, vid)
    assert vid[:10] in str(info.value)


def test_after_gc_dies_deleting_old_index_files_readers_use_the_rebased_copy(repo_path):
    """gc rebased a delta into a keyframe (new pack, new index) and died before deleting the old
    index file and pack that still name the delta, whose base is gone.  Of the two copies, readers
    and the next gc use the shallower one, so the kept version restores; before, the first copy
    met (the delta) made it unreadable and gc refused to run."""
    import shutil
    from deltackpt.format.index import decode
    torch.manual_seed(0)
    w = torch.randn(256, 64)
    deltackpt.save({"w": w}, repo_path, step=0)
    index_dir, packs_dir = os.path.join(repo_path, "index"), os.path.join(repo_path, "packs")
    before = set(os.listdir(index_dir))
    state = {"w": w + 1e-3 * torch.randn(256, 64)}
    deltackpt.save(state, repo_path, step=1)
    (second_index,) = set(os.listdir(index_dir)) - before
    saved = os.path.join(repo_path, "..", "second-save")
    os.makedirs(saved)
    shutil.copy(os.path.join(index_dir, second_index), saved)
    packs = decode(open(os.path.join(index_dir, second_index), "rb").read())
    assert any(e.depth > 0 for _, entries in packs.values() for e in entries)  # the premise: a delta
    for pid in packs:
        shutil.copy(os.path.join(packs_dir, pid[:2], pid), saved)
    deltackpt.frontend.api._OPEN.clear()
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert report.chunks_rebased > 0
    # the crash: the old index file (sorting first) and its pack are still there
    shutil.copy(os.path.join(saved, second_index), os.path.join(index_dir, "0" * 32))
    for pid in packs:
        os.makedirs(os.path.join(packs_dir, pid[:2]), exist_ok=True)
        shutil.copy(os.path.join(saved, pid), os.path.join(packs_dir, pid[:2], pid))
    _loads_before_and_after_gc(repo_path, state["w"])
