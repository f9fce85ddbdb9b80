"""A repository from a stranger (issue 5, item 10): traversal in names, symlinks, crafted
offsets, unknown codecs, future format versions, huge shapes, looping delta chains, foreign
msgpack ext types.  Every case ends in a typed DeltackptError, reads and writes nothing outside
the repository (a canary folder next to it is snapshotted before and compared after), and
executes nothing."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import struct

import msgpack
import pytest
import torch
import xxhash

import deltackpt
from deltackpt.errors import (CorruptObjectError, DeltackptError, FormatVersionError, InvalidNameError,
                              LimitExceededError, StoreError, UnknownVersionError)
from deltackpt.format import index as index_fmt
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format import pack as pack_fmt
from deltackpt.format.ids import hex_id
from deltackpt.repo.repository import Repository


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g), "step": seed}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hostile") / "repo")
    for i in range(3):
        base = _state(0)
        if i:
            base["w"] = base["w"] + 1e-3 * i  # small moves: delta chunks
        deltackpt.save(base, path, step=i)
    deltackpt.api._OPEN.clear()
    return path


def _snapshot(folder: str) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            body = b""
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    body = f.read()
            out[os.path.relpath(p, folder)] = (st.st_mode, st.st_size, st.st_mtime_ns, hashlib.sha1(body).hexdigest())
    return out


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
    deltackpt.api._OPEN.clear()
    yield root, outside
    deltackpt.api._OPEN.clear()
    assert _snapshot(outside) == before, "something outside the repository was written"


def _keys(root: str, prefix: str) -> list[str]:
    out = []
    for dirpath, _d, names in os.walk(os.path.join(root, prefix)):
        out += [os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/") for n in names]
    return sorted(out)


def _latest(root: str) -> str:
    with open(os.path.join(root, "refs", "latest")) as f:
        return f.read().strip()


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
    pid, _e = core.entry(core.manifest(_latest(root)).blobs[0].chunks[0].chunk_id)  # a pack latest reads
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


# --- crafted packs and index files --------------------------------------------------------------

def _rewrite_index(root: str, edit) -> None:
    """Apply ``edit(pack_id, entries) -> entries`` to every index file, keeping checksums valid."""
    for key in _keys(root, "index"):
        path = os.path.join(root, key)
        with open(path, "rb") as f:
            packs = index_fmt.decode(f.read())
        new = {pid: (plen, edit(pid, plen, entries)) for pid, (plen, entries) in packs.items()}
        with open(path, "wb") as f:
            f.write(index_fmt.encode(new))


def _replace(e: pack_fmt.PackEntry, **kw) -> pack_fmt.PackEntry:
    d = dict(chunk_id=e.chunk_id, offset=e.offset, length=e.length, encoding=e.encoding, raw_len=e.raw_len,
             base=e.base, depth=e.depth)
    d.update(kw)
    return pack_fmt.PackEntry(**d)


def _expect_all_versions_fail(root: str, exc=(CorruptObjectError, FormatVersionError)) -> None:
    deltackpt.api._OPEN.clear()
    with pytest.raises(exc):
        deltackpt.load(root, _latest(root))
    assert not deltackpt.Repo(root).verify().ok


def test_overlapping_offsets_in_index(env):
    """Index entries pointing into each other's bytes decode to nothing valid: CorruptObjectError, verify flags."""
    root, _ = env
    # a pack of one object (format 2 stores each head keyframe apart) gets it shifted into its header
    _rewrite_index(root, lambda pid, plen, es: [_replace(e, offset=es[0].offset + 3) if i or len(es) == 1 else e
                                               for i, e in enumerate(es)])
    _expect_all_versions_fail(root)


def test_out_of_range_offsets_in_index(env):
    """An index entry beyond its pack is refused when the index is read; the versions needing it fail typed."""
    root, _ = env
    _rewrite_index(root, lambda pid, plen, es: [_replace(e, offset=plen - 20) for e in es])
    repo = Repository(root)
    assert repo.bad_index_files  # the whole file is refused, not half-used
    _expect_all_versions_fail(root)


def test_index_claiming_a_longer_pack(env):
    """An index whose pack length and offsets run past the real file: reads stop at the file's end, typed error."""
    root, _ = env
    _rewrite_index(root, lambda pid, plen, es: [_replace(e, offset=plen + 1000, length=1 << 26) for e in es])
    # the entries lie outside the declared pack, so the index is refused; now declare a huge pack too
    for key in _keys(root, "index"):
        path = os.path.join(root, key)
        body = msgpack.unpackb(open(path, "rb").read()[8:-8], raw=False)
        for pid in body:
            body[pid][0] = 1 << 40
        data = msgpack.packb(body, use_bin_type=True)
        with open(path, "wb") as f:
            f.write(index_fmt.MAGIC + data + struct.pack("<Q", xxhash.xxh64_intdigest(data)))
    _expect_all_versions_fail(root)


def test_crafted_pack_with_overlapping_entries_is_refused():
    """A pack header whose entries overlap is refused by the pack parser."""
    entry = [b"\x01" * 16, 8, 30, 0, 18, None, 0]
    header = msgpack.packb([entry, [b"\x02" * 16, 20, 30, 0, 18, None, 0]])
    data = pack_fmt.MAGIC + bytes(60) + header + struct.pack("<IQ8s", len(header), xxhash.xxh64_intdigest(header),
                                                              pack_fmt.END_MAGIC)
    with pytest.raises(CorruptObjectError, match="overlaps"):
        pack_fmt.parse_pack(data)


def test_unknown_codec_id(env):
    """An object whose encoding id no codec owns raises CorruptObjectError naming the id."""
    root, _ = env
    for key in _keys(root, "packs"):
        path = os.path.join(root, key)
        data = bytearray(open(path, "rb").read())
        for e in pack_fmt.parse_pack(bytes(data)):
            data[e.offset + 1] = 200
        open(path, "wb").write(bytes(data))
    _rewrite_index(root, lambda pid, plen, es: [_replace(e, encoding=200) for e in es])
    deltackpt.api._OPEN.clear()
    with pytest.raises(CorruptObjectError, match="unknown encoding id 200"):
        deltackpt.load(root, _latest(root))


def test_delta_chain_that_loops(env):
    """Two chunks naming each other as delta base are detected as a loop (no hang): CorruptObjectError."""
    root, _ = env
    ids = []
    _rewrite_index(root, lambda pid, plen, es: (ids.extend(e.chunk_id for e in es), es)[1])
    a, b = ids[0], ids[1]
    _rewrite_index(root, lambda pid, plen, es: [
        _replace(e, base=b, depth=1) if e.chunk_id == a else _replace(e, base=a, depth=1) if e.chunk_id == b else e
        for e in es])
    repo = Repository(root)
    with pytest.raises(CorruptObjectError, match="loops|disagrees with the index"):
        repo.read_chunk(a)
    assert not deltackpt.Repo(root).verify().ok


# --- format versions from the future -----------------------------------------------------------

def test_future_config_version(env):
    """A config from format version 3 is refused on open with FormatVersionError (upgrade hint)."""
    root, _ = env
    cfg = msgpack.unpackb(open(os.path.join(root, "config"), "rb").read())
    cfg["version"] = 3
    open(os.path.join(root, "config"), "wb").write(msgpack.packb(cfg))
    with pytest.raises(FormatVersionError, match="upgrade"):
        deltackpt.Repo(root)


def test_future_pack_version(env):
    """A pack trailer from a newer format is refused by the parser and flagged by verify."""
    root, _ = env
    key = _keys(root, "packs")[0]
    path = os.path.join(root, key)
    data = bytearray(open(path, "rb").read())
    data[-1] = 2
    open(path, "wb").write(bytes(data))
    with pytest.raises(FormatVersionError):
        pack_fmt.parse_pack(bytes(data))
    assert not deltackpt.Repo(root).verify().ok


def test_future_manifest_version(env):
    """An intact manifest (bytes hash to its id) whose magic carries version 2 raises FormatVersionError;
    the same byte changed in place under the old id is damage (CorruptObjectError)."""
    root, _ = env
    vid = _latest(root)
    data = bytearray(open(os.path.join(root, "manifests", vid), "rb").read())
    data[6] = 2
    new = hex_id(bytes(data))
    open(os.path.join(root, "manifests", new), "wb").write(bytes(data))
    with pytest.raises(FormatVersionError):
        deltackpt.load(root, new)
    open(os.path.join(root, "manifests", vid), "wb").write(bytes(data))
    with pytest.raises(CorruptObjectError):
        deltackpt.load(root, vid)


def test_future_object_version(env):
    """An object header with version 2 raises FormatVersionError when read."""
    root, _ = env
    for key in _keys(root, "packs"):
        path = os.path.join(root, key)
        data = bytearray(open(path, "rb").read())
        for e in pack_fmt.parse_pack(bytes(data)):
            data[e.offset] = 2
        open(path, "wb").write(bytes(data))
    with pytest.raises(FormatVersionError):
        deltackpt.load(root, _latest(root))


def test_future_index_version(env):
    """An index file of a newer version is never half-read: opening the repository raises
    FormatVersionError naming the file (spec §4: the bytes are probably fine, the reader is old)."""
    root, _ = env
    for key in _keys(root, "index"):
        path = os.path.join(root, key)
        data = bytearray(open(path, "rb").read())
        data[6] = 2
        open(path, "wb").write(bytes(data))
    deltackpt.api._OPEN.clear()
    with pytest.raises(FormatVersionError, match="index/"):
        deltackpt.load(root, _latest(root))
    with pytest.raises(FormatVersionError, match="index/"):
        Repository(root)


# --- crafted manifests -------------------------------------------------------------------------

def _add_manifest(root: str, body: dict, tag: str = "crafted") -> str:
    data = manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True)
    vid = hex_id(data)
    with open(os.path.join(root, "manifests", vid), "wb") as f:
        f.write(data)
    os.makedirs(os.path.join(root, "refs", "tags"), exist_ok=True)
    with open(os.path.join(root, "refs", "tags", tag), "w") as f:
        f.write(vid + "\n")
    return vid


def _manifest_body(root: str) -> dict:
    vid = _latest(root)
    return msgpack.unpackb(open(os.path.join(root, "manifests", vid), "rb").read()[8:], raw=False,
                           strict_map_key=False)


@pytest.mark.parametrize("shape", [[1 << 40], [1 << 20, 1 << 20], [1 << 47, 4], [2] * 65])
def test_manifest_with_huge_declared_shape(env, shape):
    """A tensor claiming a huge shape over a small blob is refused before any allocation."""
    root, _ = env
    body = _manifest_body(root)
    body["tensors"][0]["shape"] = shape
    body["tensors"][0]["stride"] = [1] * len(shape)
    _add_manifest(root, body)
    with pytest.raises(CorruptObjectError):
        deltackpt.load(root, "crafted")


def test_manifest_blob_claiming_more_than_its_chunks(env):
    """A blob whose declared size disagrees with its chunk list is refused (LimitExceeded/Corrupt), nothing allocated."""
    root, _ = env
    body = _manifest_body(root)
    body["blobs"][0]["nbytes"] = 1 << 40
    _add_manifest(root, body)
    with pytest.raises(CorruptObjectError):
        deltackpt.load(root, "crafted")
    body["blobs"][0]["nbytes"] = 1 << 60
    _add_manifest(root, body, tag="crafted2")
    with pytest.raises((CorruptObjectError, LimitExceededError)):
        deltackpt.load(root, "crafted2")


@pytest.mark.parametrize("code", [0, 3, 42, 127, -1])
def test_manifest_with_foreign_ext_type(env, code):
    """msgpack ext types other than 1 (tensor) and 2 (tuple) in a manifest are refused, never interpreted."""
    root, _ = env
    body = _manifest_body(root)
    body["tree"]["extra"] = msgpack.Timestamp(1, 0) if code == -1 else msgpack.ExtType(code, b"\x80\x04payload")
    _add_manifest(root, body)
    with pytest.raises(CorruptObjectError, match="ext type"):
        deltackpt.load(root, "crafted")
    assert not deltackpt.Repo(root).verify().ok


def test_pickle_bytes_in_a_manifest_are_never_unpickled(env, tmp_path):
    """A pickle that would write a file when unpickled comes back as inert bytes: nothing is executed."""
    root, _ = env
    marker = tmp_path / "executed"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    body = _manifest_body(root)
    body["meta"] = pickle.dumps(Evil())
    body["tree"]["payload"] = pickle.dumps(Evil())
    _add_manifest(root, body)
    state = deltackpt.load(root, "crafted")
    assert isinstance(state["payload"], bytes)
    assert deltackpt.Repo(root).show("crafted") is not None
    assert not marker.exists()


def test_ext_types_in_index_and_config_are_refused(env):
    """Ext types where the index or config expects plain values raise CorruptObjectError."""
    from deltackpt.format import config as config_fmt
    with pytest.raises(CorruptObjectError):
        config_fmt.decode(msgpack.packb({"format": msgpack.ExtType(5, b"x"), "version": 1}), where="t")
    body = msgpack.packb({"0" * 32: [100, [msgpack.ExtType(9, b"\0" * 16)]]})
    data = index_fmt.MAGIC + body + struct.pack("<Q", xxhash.xxh64_intdigest(body))
    with pytest.raises(CorruptObjectError):
        index_fmt.decode(data)


def test_terabyte_blob_over_tiny_chunks_is_refused_before_allocation(env):
    """A manifest declaring a 1 TiB tensor as 16384 references to a small chunk claiming 64 MiB each passes
    the schema, but is refused (CorruptObjectError) before the 1 TiB buffer is allocated."""
    root, _ = env
    body = _manifest_body(root)
    blob = body["blobs"][0]
    cid = blob["chunks"][0][0]
    blob["chunks"] = [[cid, 64 << 20]] * 16384
    blob["nbytes"] = 1 << 40
    t = next(t for t in body["tensors"] if t["blob"] == 0)
    t.update(shape=[1 << 38], stride=[1], dtype="float32", offset=0)
    _add_manifest(root, body)
    with pytest.raises(CorruptObjectError, match="manifest says 67108864 bytes"):
        deltackpt.load(root, "crafted")
