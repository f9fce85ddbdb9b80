"""Writer settings are checked when a repository is created or opened (issue 23 item 9): a value
no config can hold, or zstd would refuse, is one InvalidArgumentError naming it, before anything is
written, instead of a config no later command can read or a raw zstd ValueError at the next save."""

from __future__ import annotations

import os

import pytest
import torch

import deltackpt
from deltackpt.errors import InvalidArgumentError
from tests.conftest import file_digests

BAD_INIT = {"keyframe_interval=-3": {"keyframe_interval": -3}, "keyframe_interval=1025": {"keyframe_interval": 1025},
            "chunk_bytes=-1": {"chunk_bytes": -1}, "chunk_bytes=2**40": {"chunk_bytes": 1 << 40},
            "chunk_bytes=1.5": {"chunk_bytes": 1.5}, "chunk_bytes=True": {"chunk_bytes": True},
            "level=99": {"level": 99}, "level=23": {"level": 23}, "level='3'": {"level": "3"}}


@pytest.mark.parametrize("name", sorted(BAD_INIT))
def test_init_with_a_setting_no_config_can_hold_writes_nothing(repo_path, name):
    with pytest.raises(InvalidArgumentError, match=name.split("=")[0].replace("level", "compression level")):
        deltackpt.Repo.init(repo_path, **BAD_INIT[name])
    assert not os.path.exists(repo_path)


@pytest.mark.parametrize("open_handle", [False, True], ids=["no-handle", "open-handle"])
def test_opening_an_existing_repository_with_a_bad_level_fails_at_once(repo_path, open_handle):
    """Repo(existing, level=99) used to open, and the next save raised zstd's ValueError; a handle
    already open is left as it was."""
    deltackpt.save({"w": torch.ones(3)}, repo_path)
    held = deltackpt.Repo(repo_path) if open_handle else None
    before = file_digests(repo_path)
    with pytest.raises(InvalidArgumentError, match="compression level .* got 99"):
        deltackpt.Repo(repo_path, level=99, chunk_bytes=4096)
    repo = held or deltackpt.Repo(repo_path)
    assert (repo.session.settings.level, repo.session.settings.chunk_bytes) == (1, 2 << 20)
    assert file_digests(repo_path) == before
    assert deltackpt.Repo(repo_path, level=-5).save({"w": torch.zeros(3)}).exact   # zstd's fast levels are fine


def test_the_extreme_valid_settings_write_a_readable_config(repo_path):
    repo = deltackpt.Repo.init(repo_path, chunk_bytes=64 << 20, keyframe_interval=1024)
    repo.save({"w": torch.arange(10.0)})
    assert deltackpt.Repo(repo_path).core.config.keyframe_interval == 1024
    assert torch.equal(deltackpt.load(repo_path)["w"], torch.arange(10.0))
