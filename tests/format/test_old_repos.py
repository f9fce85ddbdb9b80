"""Repositories written by earlier releases stay readable: tests/fixtures/repo-v1 was written by
the first format-version-1 code and is committed forever (never regenerate it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import torch

import deltackpt

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


def describe(value):
    """The same description tests/fixtures/make_repo_v1.py recorded: tensors by dtype, shape,
    stride and sha256 of their bytes; plain values as JSON."""
    if isinstance(value, torch.Tensor):
        flat = value.contiguous().reshape(-1)
        data = bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""
        return {"tensor": {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                           "stride": list(value.stride()), "sha256": hashlib.sha256(data).hexdigest()}}
    if isinstance(value, dict):
        return {"map": [[k, describe(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"tuple": [describe(v) for v in value]}
    if isinstance(value, list):
        return [describe(v) for v in value]
    if isinstance(value, bytes):
        return {"bin": value.hex()}
    if isinstance(value, float) and value != value:
        return {"float": "nan"}
    return value


def _json_roundtrip(value):
    return json.loads(json.dumps(value))  # int dict keys become str, as in the recorded file


def _copy_fixture(tmp_path, name: str) -> str:
    """A private copy, so no test can write into the committed fixture."""
    dst = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), dst, symlinks=True)
    return str(dst)


@pytest.fixture
def repo_v1(tmp_path):
    return _copy_fixture(tmp_path, "repo-v1")


@pytest.fixture
def repo_v2(tmp_path):
    """The format-2 fixture (tests/fixtures/make_repo_v2.py)."""
    return _copy_fixture(tmp_path, "repo-v2")


@pytest.fixture
def repo_v3(tmp_path):
    """The format-3 fixture (tests/fixtures/make_repo_v3.py): repo-v2's saves, version-2 index files."""
    return _copy_fixture(tmp_path, "repo-v3")


EXPECTED = {}
for _name in ("repo-v1", "repo-v2", "repo-v3"):
    with open(os.path.join(FIXTURES, f"{_name}.expected.json")) as _f:
        EXPECTED[_name] = json.load(_f)


@pytest.mark.parametrize("name, revision", [(n, r) for n in sorted(EXPECTED) for r in sorted(EXPECTED[n])])
def test_old_repo_loads_as_recorded(tmp_path, name, revision):
    """Every recorded revision of each committed fixture resolves to the same id and loads to the
    same tensors and plain values: format 1 (every codec id 0-8 is in it) and format 2 (head
    keyframes, reverse deltas, retained keyframes, lossy chunks)."""
    want = EXPECTED[name][revision]
    state, version = deltackpt.load(_copy_fixture(tmp_path, name), revision, return_version=True)
    assert version.id == want["id"] and version.step == want["step"] and version.exact == want["exact"]
    assert version.metrics == want["metrics"] and list(version.tags) == want["tags"]
    assert _json_roundtrip(describe(state)) == want["state"]


def test_repo_v1_uses_every_encoding_and_verifies(repo_v1):
    """The fixture holds objects of all nine frozen encodings and passes verify (every chunk re-hashed)."""
    repo = deltackpt.Repo(repo_v1)
    assert sorted({e.encoding for _, _, e in repo.core.index.items()}) == list(range(9))
    report = repo.verify()
    assert report.ok, report.to_json()
    assert repo.core.config.version == 1


def test_repo_v2_is_format_2_with_reverse_deltas_and_verifies(repo_v2):
    """The fixture is what it claims: config version 2, older versions stored as deltas against the
    newer version's chunks, latest one object per chunk (its lossless tensors); verify passes."""
    repo = deltackpt.Repo(repo_v2)
    core = repo.core
    assert core.config.version == 2 and core.config.delta_base == "child"
    newest = {c.chunk_id for b in core.manifest(core.resolve("latest")).blobs for c in b.chunks}
    older = {c.chunk_id for b in core.manifest(core.resolve("latest~1")).blobs for c in b.chunks} - newest
    assert any(core.index.entry(c)[1].base in newest for c in older)  # reverse deltas
    m = core.manifest(core.resolve("latest"))
    lossless = [c.chunk_id for t in m.tensors if t.encoding == "lossless" for c in m.blobs[t.blob].chunks]
    assert lossless and all(core.index.chain_depth(c) == 0 for c in lossless)
    depths = {k: [core.index.chain_depth(c.chunk_id) for b in core.manifest(core.resolve(f"latest~{k}")).blobs
                  for c in b.chunks] for k in range(5)}
    assert max(depths[4]) == 2 and max(max(d) for d in depths.values()) <= 2  # keyframe_interval 2 bounds chains
    assert repo.verify().ok


def test_a_format_1_reader_refuses_a_format_2_repository(repo_v2, monkeypatch):
    """A reader that implements only format 1 (here: this code told so) refuses the v2 fixture on
    open with FormatVersionError naming both versions, before it reads anything else."""
    from deltackpt.format import config as config_fmt
    monkeypatch.setattr(config_fmt, "READABLE_VERSIONS", (1,))
    with pytest.raises(deltackpt.FormatVersionError, match=r"version 2 .*reads versions 1"):
        deltackpt.Repo(repo_v2)


def _index_versions(path: str) -> set[int]:
    folder = os.path.join(path, "index")
    out = set()
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            out.add(f.read(8)[6])
    return out


def test_repo_v3_is_format_3_with_version_2_index_files_and_verifies(repo_v3):
    """The format-3 fixture has version-2 index files only; its newest version loads through
    lookups (no entry built per stored copy); verify passes (and holds every copy)."""
    assert _index_versions(repo_v3) == {2}
    repo = deltackpt.Repo(repo_v3)
    assert repo.core.config.version == 3
    repo.load("latest")
    assert not repo.core.index.holds_every_copy
    assert repo.verify().ok and repo.core.index.holds_every_copy


def test_a_save_keeps_each_repository_in_its_own_index_version(repo_v2, repo_v3):
    """Writing into a format-2 repository writes version-1 index files (its readers read no
    other) and leaves its config alone; a format-3 one gets version-2 files; gc consolidates
    each in its own version."""
    for path, version, index_version in ((repo_v2, 2, 1), (repo_v3, 3, 2)):
        state = deltackpt.load(path)
        state["table"] = state["table"] + 1
        deltackpt.save(state, path, step=99)
        with deltackpt.Repo(path) as repo:
            repo.gc()
            assert repo.core.config.version == version
        assert _index_versions(path) == {index_version}
        assert torch.equal(deltackpt.load(path)["table"], state["table"])
        assert deltackpt.Repo(path).verify().ok


def test_a_format_2_reader_refuses_a_format_3_repository(repo_v3, monkeypatch):
    """A reader of formats 1 and 2 only refuses the v3 fixture on open, naming both versions."""
    from deltackpt.format import config as config_fmt
    monkeypatch.setattr(config_fmt, "READABLE_VERSIONS", (1, 2))
    with pytest.raises(deltackpt.FormatVersionError, match=r"version 3 .*reads versions 1, 2"):
        deltackpt.Repo(repo_v3)
