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


def test_an_index_file_naming_a_missing_pack_neither_hides_the_chunk_nor_makes_gc_drop_it(repo_path):
    """A stale index entry (a pack that is gone) sorting first: load uses the good copy, gc keeps it."""
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 64)}
    deltackpt.save(state, repo_path, step=0)
    items = Repository(repo_path).index_items()
    plen = max(e.offset + e.length for _, _, e in items) + 20
    with open(os.path.join(repo_path, "index", "0" * 32), "wb") as f:  # sorts before the real index file
        f.write(index_fmt.encode({"0" * 32: (plen, [e for _, _, e in items])}))
    deltackpt.frontend.api._OPEN.clear()
    assert torch.equal(deltackpt.load(repo_path)["w"], state["w"])
    deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    deltackpt.frontend.api._OPEN.clear()
    assert torch.equal(deltackpt.load(repo_path)["w"], state["w"])
    assert deltackpt.Repo(repo_path).verify().ok


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
