"""A damaged object is caught by verify and by load, naming the versions it belongs to."""

from __future__ import annotations

import os

import pytest
import torch

import deltackpt


def _flip_byte_in_first_pack(path: str, offset_from_start: int = 200) -> str:
    packs = []
    for root, _, files in os.walk(os.path.join(path, "packs")):
        packs += [os.path.join(root, f) for f in files]
    target = sorted(packs, key=os.path.getsize)[-1]
    with open(target, "r+b") as f:
        f.seek(offset_from_start)
        b = f.read(1)
        f.seek(offset_from_start)
        f.write(bytes([b[0] ^ 0x40]))
    return target


def test_flipped_bit_is_reported_by_verify_and_refused_by_load(repo_path):
    """A flipped bit inside a chunk object fails verify (naming the version) and load raises CorruptObjectError."""
    torch.manual_seed(0)
    v = deltackpt.save({"w": torch.randn(256, 256)}, repo_path)
    _flip_byte_in_first_pack(repo_path)
    report = deltackpt.Repo(repo_path).verify()
    assert not report.ok and v.id in report.bad_versions
    with pytest.raises(deltackpt.CorruptObjectError) as info:
        deltackpt.load(repo_path)
    assert v.short_id in str(info.value) and isinstance(info.value, ValueError)


def test_unaffected_versions_still_load_after_damage(repo_path):
    """Damage to one tensor's chunk leaves versions that do not use it loadable."""
    a = {"x": torch.randn(128, 128)}
    deltackpt.save(a, repo_path)
    b = {"y": torch.randn(128, 128)}
    deltackpt.save(b, repo_path)
    repo = deltackpt.Repo(repo_path)
    m = repo.core.manifest(repo.core.resolve("latest"))
    pid, entry = repo.core.index.entry(m.blobs[0].chunks[0].chunk_id)
    with open(os.path.join(repo_path, "packs", pid[:2], pid), "r+b") as f:
        f.seek(entry.offset + entry.length - 5)
        f.write(b"\x00\x01\x02\x03\x04")
    report = repo.verify()
    assert report.bad_versions == [repo.core.resolve("latest")]
    assert torch.equal(deltackpt.load(repo_path, "latest~1")["x"], a["x"])
    with pytest.raises(deltackpt.CorruptObjectError):
        deltackpt.load(repo_path, "latest")


def test_future_format_version_is_refused_clearly(repo_path):
    """A repository whose config says format version 4 (newer than this code) is refused with FormatVersionError."""
    from deltackpt.format import msgpack_io
    deltackpt.save({"x": torch.zeros(1)}, repo_path)
    with open(os.path.join(repo_path, "config"), "wb") as f:
        f.write(msgpack_io.pack({"format": "deltackpt", "version": 4, "repo_id": "x"}))
    with pytest.raises(deltackpt.FormatVersionError, match="version 4"):
        deltackpt.load(repo_path)


def test_opening_a_non_repository_is_a_typed_error(tmp_path):
    """Loading from a folder that is not a repository raises NotARepositoryError."""
    with pytest.raises(deltackpt.NotARepositoryError):
        deltackpt.load(str(tmp_path))
