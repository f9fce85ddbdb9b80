"""A repository from a stranger (issue 5, item 10): traversal in names, symlinks, crafted
offsets, unknown codecs, future format versions, huge shapes, looping delta chains, foreign
msgpack ext types.  Every case ends in a typed DeltackptError, reads and writes nothing outside
the repository (a canary folder next to it is snapshotted before and compared after), and
executes nothing.  This module: names and symbolic links; crafted packs, index files and future
format versions in test_hostile_packs.py; crafted manifests in test_hostile_manifests.py."""

from __future__ import annotations

import os
import shutil

import pytest

import deltackpt
from deltackpt.errors import DeltackptError, InvalidNameError, StoreError, UnknownVersionError
from deltackpt.repo.repository import Repository

from ._hostile_env import _keys, _latest, _snapshot, _state


def _link(root: str, key: str, target: str) -> None:
    path = os.path.join(root, key)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


# --- names -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../evil", "..", "a/b", "/abs", "..%2f", "x/../../y", ".hidden", "-opt",
                                  "t.lock", "t.tmp", "a\x00b", "a\\b", "é", "", "x" * 129, "latest", "best_x"])
def test_bad_tag_names_are_refused(env, name):
    """Tag names with separators, dots, traversal, NUL, reserved words or odd lengths raise InvalidNameError and write nothing."""
    root, _outside = env
    before = _keys(root, "refs")
    with pytest.raises(InvalidNameError):
        deltackpt.Repo(root).tag(name)
    with pytest.raises(InvalidNameError):
        deltackpt.save(_state(5), root, tag=name)
    assert _keys(root, "refs") == before


@pytest.mark.parametrize("revision", ["../../outside/mirror/refs/latest", "../outside", "refs/latest",
                                      "..%2f..%2fcanary", "/etc/passwd", "tags/../latest"])
def test_traversal_revisions_resolve_to_nothing(env, revision):
    """Revisions with path syntax never reach a file: they raise UnknownVersionError."""
    root, _outside = env
    with pytest.raises(UnknownVersionError):
        deltackpt.load(root, revision)


@pytest.mark.parametrize("fname", ["..%2f", "sub/name", "x.lock", ".hidden"])
def test_foreign_files_in_refs_tags_are_ignored_and_reported(env, fname):
    """A file under refs/tags/ that is not a valid tag name is never used as a tag and verify reports it."""
    root, _outside = env
    path = os.path.join(root, "refs", "tags", *fname.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(_latest(root) + "\n")
    repo = deltackpt.Repo(root)
    assert repo.tags() == {}
    report = repo.verify()
    assert not report.ok and any(p.object == "refs/tags/" + fname for p in report.errors)
    with pytest.raises(UnknownVersionError):
        deltackpt.load(root, fname)


# --- symbolic links ----------------------------------------------------------------------------

def test_symlinked_pack_is_refused(env):
    """A pack that is a symlink (to valid bytes outside) is refused: load raises a typed error, verify flags it."""
    root, outside = env
    core = Repository(root)
    pid, _e = core.index.entry(core.manifest(_latest(root)).blobs[0].chunks[0].chunk_id)  # a pack latest reads
    key = f"packs/{pid[:2]}/{pid}"
    _link(root, key, os.path.join(outside, "mirror", key))
    with pytest.raises(StoreError, match="symbolic link"):
        deltackpt.load(root, _latest(root))
    assert not deltackpt.Repo(root).verify().ok


def test_symlinked_manifest_is_refused(env):
    """A manifest that is a symlink to a valid copy outside is refused with a typed error."""
    root, outside = env
    vid = _latest(root)
    _link(root, f"manifests/{vid}", os.path.join(outside, "mirror", "manifests", vid))
    with pytest.raises((StoreError, UnknownVersionError)):  # a symlink is not listed as a version
        deltackpt.load(root, vid)
    with pytest.raises(StoreError, match="symbolic link"):
        Repository(root).manifest(vid)
    report = deltackpt.Repo(root).verify()
    assert not report.ok and vid in report.bad_versions


def test_symlinked_tags_dir_is_neither_read_nor_written(env):
    """refs/tags linked to a folder outside: tags there are not read, and tagging writes nothing there."""
    root, outside = env
    evil = os.path.join(os.path.dirname(outside), "elsewhere", "tags")
    os.makedirs(evil)
    with open(os.path.join(evil, "evil"), "w") as f:
        f.write(_latest(root) + "\n")
    _link(root, "refs/tags", evil)
    snap = _snapshot(evil)
    with pytest.raises(UnknownVersionError):
        deltackpt.load(root, "evil")
    with pytest.raises(StoreError, match="symbolic links are refused"):
        deltackpt.Repo(root).tag("newtag")
    with pytest.raises(StoreError):
        deltackpt.Repo(root).tags()
    assert _snapshot(evil) == snap


@pytest.mark.parametrize("folder", ["packs", "index", "manifests", "tmp", "locks"])
def test_save_into_symlinked_folder_writes_nothing_outside(env, folder):
    """A save never writes through a symlinked folder (packs, index, manifests, tmp, locks): it raises a typed error."""
    root, outside = env
    target = os.path.join(outside, "mirror", folder)
    os.makedirs(target, exist_ok=True)
    snap = _snapshot(target)
    _link(root, folder, target)
    with pytest.raises(DeltackptError):
        deltackpt.save(_state(9), root, step=9)
    assert _snapshot(target) == snap


def test_symlinked_config_is_refused(env):
    """A config that is a symlink is refused on open with a typed error."""
    root, outside = env
    _link(root, "config", os.path.join(outside, "mirror", "config"))
    with pytest.raises(StoreError):
        deltackpt.Repo(root)
