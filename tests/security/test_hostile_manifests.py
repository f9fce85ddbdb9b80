"""A repository from a stranger (issue 5, item 10), continued: crafted manifests (huge declared
shapes, blobs claiming more than their chunks, foreign msgpack ext types, pickles).  Each case ends
in a typed DeltackptError or inert data, executes nothing, and touches nothing outside the
repository (the ``env`` fixture checks a canary folder)."""

from __future__ import annotations

import os
import pickle
import struct

import msgpack
import pytest
import xxhash

import deltackpt
from deltackpt.errors import CorruptObjectError, LimitExceededError
from deltackpt.format import index as index_fmt
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format.ids import hex_id

from ._hostile_env import _latest


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
