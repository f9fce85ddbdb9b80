"""The hostile-repository tests' shared fixtures: a small template repository, and a fresh copy of
it beside an "outside" folder whose contents must never change (test_hostile_repos, _packs and
_manifests request them; modules with a template of their own override it)."""

from __future__ import annotations

import os
import shutil

import pytest

import deltackpt

from ._hostile_env import _snapshot, _state


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hostile") / "repo")
    for i in range(3):
        base = _state(0)
        if i:
            base["w"] = base["w"] + 1e-3 * i  # small moves: delta chunks
        deltackpt.save(base, path, step=i)
    return path


@pytest.fixture
def env(template, tmp_path):
    """A fresh copy of the template repository and an 'outside' folder holding a canary and a copy
    of every repository file (so a followed link would find valid bytes and succeed visibly)."""
    root = str(tmp_path / "repo")
    outside = str(tmp_path / "outside")
    shutil.copytree(template, root)
    shutil.copytree(template, os.path.join(outside, "mirror"))
    with open(os.path.join(outside, "canary"), "w") as f:
        f.write("canary")
    before = _snapshot(outside)
    yield root, outside
    assert _snapshot(outside) == before, "something outside the repository was written"
