"""A repository deleted (or replaced) while a ``Repo`` handle is open (issue 23 item 3): the next
write through the handle fails with one typed line naming the location, and writes nothing, where it
used to return a version id into a folder with no config."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import deltackpt
from deltackpt.errors import NotARepositoryError
from tests.conftest import file_digests, run_cli


@pytest.fixture
def open_then_deleted(repo_path):
    with deltackpt.Repo(repo_path, create=True) as repo:
        v1 = repo.save({"w": torch.arange(6.0)}, step=1)
        shutil.rmtree(repo_path)
        yield repo, v1


def test_save_through_a_handle_of_a_deleted_repository_fails_typed_and_writes_nothing(repo_path, open_then_deleted):
    repo, _v1 = open_then_deleted
    with pytest.raises(NotARepositoryError, match=f"{repo_path}: the repository is gone"):
        repo.save({"w": torch.zeros(6)}, step=2)
    assert not os.path.exists(repo_path)   # no pack, lock, manifest or ref written into the void


@pytest.mark.parametrize("background", ["thread", "process"])
def test_background_save_of_a_deleted_repository_fails_typed(repo_path, open_then_deleted, background):
    repo, _v1 = open_then_deleted
    handle = repo.save({"w": torch.zeros(6)}, step=2, blocking=False, background=background)
    with pytest.raises(NotARepositoryError, match="the repository is gone"):
        handle.wait()
    assert not os.path.exists(repo_path)


def test_gc_through_a_handle_of_a_deleted_repository_fails_typed(repo_path, open_then_deleted):
    repo, _v1 = open_then_deleted
    with pytest.raises(NotARepositoryError, match="the repository is gone"):
        repo.gc(keep_last=1)
    assert not os.path.exists(repo_path)


def test_a_repository_created_in_its_place_is_not_written_with_the_old_handle(repo_path, open_then_deleted):
    """Another process made a new repository at the same path: the old handle's index and delta
    cache describe the deleted one, so its save is refused and the new repository is untouched."""
    repo, _v1 = open_then_deleted
    run_cli("init", "--repo", repo_path)
    before = file_digests(repo_path)
    with pytest.raises(NotARepositoryError, match="another repository replaced"):
        repo.save({"w": torch.zeros(6)}, step=2)
    assert file_digests(repo_path) == before
    assert deltackpt.save({"w": torch.zeros(6)}, repo_path).step is None   # a fresh handle saves normally
