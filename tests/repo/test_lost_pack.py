"""A lost pack file does not poison later saves: a save never references (nor deltas against) a
chunk whose pack, or whose delta base's pack, is gone; it writes the chunk again."""

from __future__ import annotations

import os

import pytest
import torch

import deltackpt
from deltackpt.store.base import WrappingStore
from deltackpt.store.local import LocalStore


def _packs(path: str) -> set[str]:
    root = os.path.join(path, "packs")
    return {os.path.join(d, f) for d, _dirs, files in os.walk(root) for f in files}


def _lose(packs: set[str]) -> None:
    for p in packs:
        os.remove(p)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _loads_exactly(path: str, version: str, state: dict) -> None:
    out = deltackpt.load(path, version)
    assert out.keys() == state.keys()
    for k, t in state.items():
        assert torch.equal(_bits(out[k]), _bits(t)), k


def test_a_save_after_a_lost_pack_writes_the_lost_chunks_again(repo_path):
    """Unchanged tensors whose pack was lost are stored again by the next save, which then loads
    bit for bit and verifies; only the version that lost its own data is reported."""
    g = torch.Generator().manual_seed(0)
    keep, change = torch.randn(256, 64, generator=g), torch.randn(256, 64, generator=g)
    v1 = deltackpt.save({"keep": keep, "change": change}, repo_path)
    _lose(_packs(repo_path))
    state2 = {"keep": keep, "change": torch.randn(256, 64, generator=g)}
    with pytest.warns(RuntimeWarning, match="missing.*deltackpt verify"):   # the loss is told, not hidden
        v2 = deltackpt.save(state2, repo_path)
    assert v2.written_bytes >= keep.numel() * 4 // 2, v2.written_bytes   # "keep" was written again
    deltackpt.api._OPEN.clear()   # a fresh handle: the index read from the files
    _loads_exactly(repo_path, v2.id, state2)
    report = deltackpt.Repo(repo_path).verify()
    assert report.bad_versions == [v1.id], report.to_json()


def test_a_delta_is_never_taken_against_a_base_whose_pack_is_lost(repo_path):
    """A tensor that changed a little after its pack was lost is stored whole (not as a delta
    against the lost chunk), so the new version loads and verifies."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(512, 128, generator=g)
    v1 = deltackpt.save({"w": w}, repo_path)   # this process's delta cache now holds w's chunks
    _lose(_packs(repo_path))
    state2 = {"w": w + 1e-4 * torch.randn(512, 128, generator=g)}
    with pytest.warns(RuntimeWarning, match="missing"):
        v2 = deltackpt.save(state2, repo_path)
    deltackpt.api._OPEN.clear()
    _loads_exactly(repo_path, v2.id, state2)
    assert deltackpt.Repo(repo_path).verify().bad_versions == [v1.id]


def test_a_chunk_whose_delta_base_lost_its_pack_is_written_again(repo_path):
    """Saving bytes identical to a stored delta whose base's pack was lost (the delta's own pack
    intact) writes them again instead of referencing the unreadable delta."""
    g = torch.Generator().manual_seed(2)
    deltackpt.Repo.init(repo_path, delta_base="parent")  # forward chains are what this pins
    w1 = torch.randn(512, 128, generator=g)
    deltackpt.save({"w": w1}, repo_path)
    first = _packs(repo_path)
    w2 = w1 + 1e-4 * torch.randn(512, 128, generator=g)
    v2 = deltackpt.save({"w": w2}, repo_path)
    assert deltackpt.Repo(repo_path).show(v2.id)["written"]["encodings"].keys() - {"zstd", "raw", "bytegroup-zstd"}
    _lose(first)                        # the keyframe's pack; the delta's pack stays
    deltackpt.api._OPEN.clear()   # no delta cache: the same bytes are a pure dedup hit
    with pytest.warns(RuntimeWarning, match="missing"):
        v3 = deltackpt.save({"w": w2.clone()}, repo_path)
    assert v3.written_bytes > w2.numel() * 4 // 4, v3.written_bytes
    deltackpt.api._OPEN.clear()
    _loads_exactly(repo_path, v3.id, {"w": w2})
    assert v3.id not in deltackpt.Repo(repo_path).verify().bad_versions


class _CountingExists(WrappingStore):
    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.pack_exists: list[str] = []

    def exists(self, key: str) -> bool:
        if key.startswith("packs/"):
            self.pack_exists.append(key)
        return self.inner.exists(key)


def test_the_pack_check_costs_one_exists_per_distinct_pack(tmp_path):
    """A save whose 64 chunks all dedup against one stored pack asks the store about that pack once."""
    store = _CountingExists(LocalStore(str(tmp_path / "r")))
    repo = deltackpt.Repo(store, create=True, chunk_bytes=64 << 10)
    w = torch.randn(1024, 1024)   # 4 MiB: 64 chunks, one pack
    repo.save({"w": w})
    assert len(_packs(str(tmp_path / "r"))) == 1
    store.pack_exists.clear()
    repo.save({"w": w.clone(), "step": 1})
    assert len(store.pack_exists) == 1, store.pack_exists
