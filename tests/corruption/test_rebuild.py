"""The index is derived data: rebuild_index restores it from the pack headers (issue 5, item 4),
and gc refuses to run while index entries are missing (it would delete the packs holding them)."""

from __future__ import annotations

import os
import shutil

import pytest

import deltackpt
from deltackpt.errors import CorruptObjectError
from deltackpt.repo.maintain.rebuild import rebuild_index

from ._model import build, state_digest, survey


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("rebuild") / "repo")
    build(path)
    return survey(path)


@pytest.fixture
def copy(pristine, tmp_path):
    root = str(tmp_path / "repo")
    shutil.copytree(pristine.path, root)
    return root


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def _all_restore(pristine, root: str) -> None:
    for vid in pristine.versions:
        assert state_digest(deltackpt.load(root, vid)) == pristine.digests[vid], vid


def test_rebuild_after_deleting_every_index_file(pristine, copy):
    """With every index file deleted, verify fails and no version loads; rebuild_index brings all back."""
    for key in pristine.files["index"]:
        os.unlink(os.path.join(copy, key))
    repo = deltackpt.Repo(copy)
    assert set(repo.verify().bad_versions) == set(pristine.versions)
    with pytest.raises(CorruptObjectError):
        deltackpt.load(copy, pristine.versions[-1])
    report = rebuild_index(repo.core)
    assert report.packs_indexed == len(pristine.files["pack"]) and not report.packs_skipped
    assert sum(len(c) for c in pristine.index_chunks.values()) == report.chunks_indexed
    assert repo.verify().ok
    _all_restore(pristine, copy)


def test_rebuild_after_corrupting_index_files(pristine, copy):
    """Bit-flipped index files are skipped on open, reported by verify, and replaced by rebuild_index."""
    damaged = pristine.files["index"][::2]
    for key in damaged:
        _flip(os.path.join(copy, key), 20)
    repo = deltackpt.Repo(copy)
    assert set(repo.core.index.bad_files) == set(damaged)
    report = repo.verify()
    assert not report.ok and {p.object for p in report.errors} >= set(damaged)
    out = rebuild_index(repo.core)
    assert set(out.removed_index_files) == set(pristine.files["index"])
    assert os.listdir(os.path.join(copy, "index")) == [out.index_key.split("/")[1]]
    assert repo.verify().ok and not repo.core.index.bad_files
    _all_restore(pristine, copy)


def test_rebuild_skips_a_pack_with_a_damaged_header(pristine, copy):
    """A pack whose header is damaged is reported and left unindexed; the other packs are indexed."""
    key = pristine.files["pack"][0]
    path = os.path.join(copy, key)
    _flip(path, os.path.getsize(path) - 30)  # inside the msgpack header, before the trailer
    repo = deltackpt.Repo(copy)
    out = rebuild_index(repo.core)
    assert list(out.packs_skipped) == [key] and "checksum" in out.packs_skipped[key]
    assert out.packs_indexed == len(pristine.files["pack"]) - 1
    lost = pristine.users({e.chunk_id for e in pristine.pack_entries[key]})
    assert set(repo.verify().bad_versions) >= lost and lost


def test_gc_refuses_with_a_damaged_index_file(pristine, copy):
    """gc refuses while an index file is damaged (its packs would look unreferenced and be deleted)."""
    _flip(os.path.join(copy, pristine.files["index"][0]), 20)
    packs_before = sorted(os.listdir(os.path.join(copy, "packs")))
    with pytest.raises(CorruptObjectError, match="rebuild_index"):
        deltackpt.gc(copy, keep_last=2, grace_seconds=0)
    assert sorted(os.listdir(os.path.join(copy, "packs"))) == packs_before
    rebuild_index(deltackpt.Repo(copy).core)
    deltackpt.gc(copy, keep_last=2, grace_seconds=0)
    assert deltackpt.Repo(copy).verify().ok


def test_gc_refuses_with_a_deleted_index_file(pristine, copy):
    """gc refuses while chunks of kept versions are missing from the index (a deleted index file)."""
    os.unlink(os.path.join(copy, pristine.files["index"][0]))
    with pytest.raises(CorruptObjectError, match="rebuild_index"):
        deltackpt.gc(copy, keep_last=10, grace_seconds=0)
    rebuild_index(deltackpt.Repo(copy).core)
    deltackpt.gc(copy, keep_last=10, grace_seconds=0)
    _all_restore(pristine, copy)
