"""FIFOs and sparse files in a stranger's repository (issue 16, items 9 and 10).

Opening a FIFO for reading waits for a writer, so a FIFO as ``config`` or among the packs or
manifests hung ``log`` and ``verify`` forever; and sizes were compared with their limits only
after the whole file was read, so a sparse 1 GiB config cost 1 GiB of memory and a 1 TiB one died
with a bare MemoryError.  Every case runs the reader in a child process with a timeout (a hang is
a failure) and checks its typed error and its peak RSS against the same reader on the intact
repository."""

from __future__ import annotations

import os
import shutil

import pytest

import deltackpt

from ._hostile import latest, make_repo, probe, root  # noqa: F401  (root: a fixture)

TIMEOUT = 90  # seconds: every case answers in about two; a FIFO hang never does
RSS_MARGIN_MIB = 48  # over the same reader on the intact repository (a sparse GiB read whole: 1024)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return make_repo(str(tmp_path_factory.mktemp("special") / "repo"), versions=3)



def _keys(root: str, folder: str) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(os.path.join(root, folder)):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return sorted(out)


def _fifo(root: str, key: str) -> None:
    path = os.path.join(root, key)
    if os.path.lexists(path):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkfifo(path)


def _sparse(root: str, key: str, size: int) -> None:
    path = os.path.join(root, key)
    if os.path.lexists(path):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    assert os.stat(path).st_blocks == 0


# --- FIFOs (item 9) ------------------------------------------------------------------------------

def test_fifo_as_config_is_refused_without_blocking(root):
    """A FIFO as config: log exits 3 and verify raises StoreError naming 'config' as a FIFO, at once."""
    _fifo(root, "config")
    rep = probe("cli", root, "log", timeout=TIMEOUT)
    assert rep["rc"] == 3 and "'config' is not a regular file (a FIFO)" in rep["output"], rep
    rep = probe("verify", root, timeout=TIMEOUT)
    assert rep["error"] == "StoreError" and "'config' is not a regular file" in rep["message"], rep


def test_fifo_as_the_latest_manifest(root):
    """The latest version's manifest replaced by a FIFO: log lists the other versions, verify names the
    version, load raises StoreError naming the manifest; nothing blocks."""
    vid = latest(root)
    parent = deltackpt.Repo(root).log()[1].id
    _fifo(root, f"manifests/{vid}")
    rep = probe("cli", root, "log", timeout=TIMEOUT)
    assert rep["rc"] == 0 and rep["output"].count("\n") >= 3, rep
    rep = probe("verify", root, timeout=TIMEOUT)
    assert not rep["ok"] and any(vid[:10] in why for _obj, why in rep["errors"]), rep
    rep = probe("load", root, timeout=TIMEOUT)
    assert rep["error"] in ("StoreError", "UnknownVersionError") and vid in rep["message"], rep
    rep = probe("load", root, parent, timeout=TIMEOUT)
    assert rep["outcome"] == "ok", rep


def test_fifo_as_a_pack(root):
    """Every pack replaced by a FIFO: verify reports each (naming the pack) and load raises StoreError,
    without blocking; rebuild-index runs."""
    keys = _keys(root, "packs")
    for key in keys:
        _fifo(root, key)
    rep = probe("verify", root, timeout=TIMEOUT)
    assert not rep["ok"] and {obj for obj, _why in rep["errors"]} >= set(keys), rep
    rep = probe("load", root, timeout=TIMEOUT)
    assert rep["error"] == "StoreError" and "not a regular file (a FIFO)" in rep["message"], rep
    rep = probe("rebuild", root, timeout=TIMEOUT)
    assert rep["outcome"] == "ok", rep


@pytest.mark.parametrize("key", ["index/" + "f" * 32, "manifests/" + "e" * 32, "packs/ee/" + "e" * 32,
                                 "refs/tags/fifo", "tmp/x.tmp"])
def test_stray_fifos_are_not_keys(root, key):
    """A FIFO added among index files, manifests, packs, tags or temp files is not listed as a key: log,
    verify, load and a new save all work as on the intact repository."""
    _fifo(root, key)
    rep = probe("cli", root, "log", timeout=TIMEOUT)
    assert rep["rc"] == 0, rep
    rep = probe("verify", root, timeout=TIMEOUT)
    assert rep["ok"], rep
    assert probe("load", root, timeout=TIMEOUT)["outcome"] == "ok"
    assert probe("save", root, timeout=TIMEOUT)["outcome"] == "ok"


@pytest.mark.parametrize("key", ["refs/latest", "locks/refs"])
def test_fifo_as_a_ref_or_lock_file(root, key):
    """A FIFO as refs/latest or the refs lock: a save raises a typed error at once (StoreError naming
    it), never waits for a writer."""
    _fifo(root, key)
    rep = probe("save", root, timeout=TIMEOUT)
    assert rep["outcome"] == "error" and rep["typed"], rep
    assert "not a regular file" in rep["message"] and key in rep["message"], rep


# --- sparse files (item 10) ------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1 << 30, 1 << 40])
def test_sparse_config_is_refused_from_its_size(root, template, size):
    """A sparse 1 GiB or 1 TiB config: log exits 3 with LimitExceededError's message, in flat memory."""
    _sparse(root, "config", size)
    base = probe("cli", template, "log", timeout=TIMEOUT)
    rep = probe("cli", root, "log", timeout=TIMEOUT)
    assert rep["rc"] == 3 and f"'config': {size} bytes exceeds the limit" in rep["output"], rep
    assert rep["rss_mib"] - base["rss_mib"] < RSS_MARGIN_MIB, (rep, base)


@pytest.mark.parametrize("size", [1 << 30, 1 << 40])
def test_sparse_manifest_is_refused_from_its_size(root, template, size):
    """The latest manifest replaced by a sparse 1 GiB / 1 TiB file: load raises LimitExceededError
    naming it, verify names the version, both in flat memory."""
    vid = latest(root)
    _sparse(root, f"manifests/{vid}", size)
    base = probe("load", template, timeout=TIMEOUT)
    rep = probe("load", root, timeout=TIMEOUT)
    assert rep["error"] == "LimitExceededError" and f"manifests/{vid}" in rep["message"], rep
    assert rep["rss_mib"] - base["rss_mib"] < RSS_MARGIN_MIB, (rep, base)
    base = probe("verify", template, timeout=TIMEOUT)
    rep = probe("verify", root, timeout=TIMEOUT)
    assert not rep["ok"] and any(obj == f"manifests/{vid}" for obj, _why in rep["errors"]), rep
    assert rep["rss_mib"] - base["rss_mib"] < RSS_MARGIN_MIB, (rep, base)


def test_sparse_index_file_is_refused_from_its_size(root, template):
    """An index file replaced by a sparse file above MAX_INDEX_BYTES (1 TiB): the repository opens, verify
    names the file, rebuild-index restores the index, in flat memory."""
    key = _keys(root, "index")[0]
    _sparse(root, key, 1 << 40)
    base = probe("verify", template, timeout=TIMEOUT)
    rep = probe("verify", root, timeout=TIMEOUT)
    assert not rep["ok"] and any(obj == key and "exceeds the limit" in why for obj, why in rep["errors"]), rep
    assert rep["rss_mib"] - base["rss_mib"] < RSS_MARGIN_MIB, (rep, base)
    assert probe("rebuild", root, timeout=TIMEOUT)["outcome"] == "ok"
    assert probe("verify", root, timeout=TIMEOUT)["ok"]


@pytest.mark.parametrize("size", [1 << 30, (1 << 40) + 1])
def test_sparse_pack_is_checked_in_pieces(root, template, size):
    """Every pack replaced by a sparse 1 GiB file (under MAX_PACK_BYTES) or one above it: verify names
    each pack, load raises a typed error and rebuild-index skips them, in flat memory (verify read
    packs whole: a bare MemoryError at 1 TiB)."""
    keys = _keys(root, "packs")
    for key in keys:
        _sparse(root, key, size)
    for mode in ("verify", "load", "rebuild"):
        base = probe(mode, template, timeout=TIMEOUT)
        rep = probe(mode, root, timeout=TIMEOUT)
        assert rep["rss_mib"] - base["rss_mib"] < RSS_MARGIN_MIB, (mode, rep, base)
        if mode == "verify":
            assert not rep["ok"] and {obj for obj, _why in rep["errors"]} >= set(keys), rep
        elif mode == "load":
            assert rep["outcome"] == "error" and rep["typed"], rep
        else:
            assert set(rep["skipped"]) == set(keys), rep


def test_sparse_stale_lock_file_is_broken_without_reading_it(root, template, tmp_path):
    """A sparse 1 TiB refs lock left hours ago: a save judges it by age, breaks it and commits, in flat
    memory (the lock was read whole: a bare MemoryError)."""
    _sparse(root, "locks/refs", 1 << 40)
    old = os.stat(os.path.join(root, "locks", "refs")).st_mtime - 24 * 3600
    os.utime(os.path.join(root, "locks", "refs"), (old, old))
    plain = str(tmp_path / "plain")
    shutil.copytree(template, plain)
    base = probe("save", plain, timeout=TIMEOUT)
    rep = probe("save", root, timeout=TIMEOUT)
    assert rep["outcome"] == "ok" and latest(root) == rep["version"], rep
    assert rep["rss_mib"] - base["rss_mib"] < RSS_MARGIN_MIB, (rep, base)
