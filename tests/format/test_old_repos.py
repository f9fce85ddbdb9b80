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


@pytest.fixture
def repo_v1(tmp_path):
    """A private copy, so no test can write into the committed fixture."""
    dst = tmp_path / "repo-v1"
    shutil.copytree(os.path.join(FIXTURES, "repo-v1"), dst, symlinks=True)
    return str(dst)


with open(os.path.join(FIXTURES, "repo-v1.expected.json")) as _f:
    EXPECTED = json.load(_f)


@pytest.mark.parametrize("revision", sorted(EXPECTED))
def test_repo_v1_loads_as_recorded(repo_v1, revision):
    """Every recorded revision of the v1 fixture resolves to the same id and loads to the same
    tensors (every codec id 0-8 is in the fixture) and plain values."""
    want = EXPECTED[revision]
    state, version = deltackpt.load(repo_v1, revision, return_version=True)
    assert version.id == want["id"] and version.step == want["step"] and version.exact == want["exact"]
    assert version.metrics == want["metrics"] and list(version.tags) == want["tags"]
    assert _json_roundtrip(describe(state)) == want["state"]


def test_repo_v1_uses_every_encoding_and_verifies(repo_v1):
    """The fixture holds objects of all nine frozen encodings and passes verify (every chunk re-hashed)."""
    repo = deltackpt.Repo(repo_v1)
    assert sorted({e.encoding for _, _, e in repo.core.index_items()}) == list(range(9))
    report = repo.verify()
    assert report.ok, report.to_json()
    assert repo.core.config.version == 1
