"""A repository from a stranger (issue 5, item 10), continued: crafted packs and index files
(overlapping and out-of-range offsets, unknown codec ids, looping delta chains) and files from
future format versions.  Each case ends in a typed DeltackptError and touches nothing outside the
repository (the ``env`` fixture checks a canary folder)."""

from __future__ import annotations

import os
import struct

import msgpack
import pytest
import xxhash

import deltackpt
from deltackpt.errors import CorruptObjectError, FormatVersionError
from deltackpt.format import index as index_fmt
from deltackpt.format import pack as pack_fmt
from deltackpt.format.ids import hex_id
from deltackpt.repo.repository import Repository

from ._hostile_env import _keys, _latest, _replace, _rewrite_index


# --- crafted packs and index files --------------------------------------------------------------

def _expect_all_versions_fail(root: str, exc=(CorruptObjectError, FormatVersionError)) -> None:
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
    assert repo.index.bad_files  # the whole file is refused, not half-used
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
        repo.chunks.read_chunk(a)
    assert not deltackpt.Repo(root).verify().ok


# --- format versions from the future -----------------------------------------------------------

def test_future_config_version(env):
    """A config from format version 4 is refused on open with FormatVersionError (upgrade hint)."""
    root, _ = env
    cfg = msgpack.unpackb(open(os.path.join(root, "config"), "rb").read())
    cfg["version"] = 4
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
        data[6] = 3
        open(path, "wb").write(bytes(data))
    with pytest.raises(FormatVersionError, match="index/"):
        deltackpt.load(root, _latest(root))
    with pytest.raises(FormatVersionError, match="index/"):
        Repository(root)
