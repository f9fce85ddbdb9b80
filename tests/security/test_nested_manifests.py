"""Manifests whose tree nests tuples (msgpack ext type 2) deeply (issue 16, item 8).

A tuple's payload was decoded from inside the ext hook, so each level cost a C stack frame holding
msgpack's parser stack and kept its payload alive: 200 levels in 1.7 KB segfaulted every reader,
and a 4 MiB manifest 120 levels deep took 528 MiB.  Each case runs the reader in a child process
(a segfault is a signal there, not a dead pytest) and checks its exit, its typed error and its
peak RSS."""

from __future__ import annotations

import os

import msgpack
import pytest

import deltackpt
from deltackpt.errors import LimitExceededError, UnsupportedLeafError
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format.limits import MAX_MSGPACK_DEPTH, MAX_TUPLE_PAYLOAD_BYTES

from ._hostile import (commit_raw_manifest, latest, make_repo, manifest_body, nested_tuples, probe,  # noqa: F401
                       root)  # root: a fixture

READERS = [("cli", "log"), ("cli", "verify"), ("load",), ("verify",), ("resume",)]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return make_repo(str(tmp_path_factory.mktemp("nested") / "repo"))



def _raw(root: str, tree_value: object) -> bytes:
    body = manifest_body(root)
    body["tree"]["n"] = tree_value
    return manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True)


def test_200_nested_tuples_no_longer_crash_any_reader(root):
    """A 1.3 KB manifest nesting 200 tuples (within the depth limit) reads back in log, verify, load
    and resume: no segfault, and load returns the 200 tuples."""
    data = _raw(root, nested_tuples(200, "x"))
    assert len(data) < 2000
    vid = commit_raw_manifest(root, data)
    for reader in READERS:
        rep = probe(reader[0], root, *reader[1:])
        assert rep["outcome"] != "error", rep
        if reader == ("cli", "log"):
            assert rep["rc"] == 0 and vid[:10] in rep["output"]
    state = deltackpt.load(root)
    depth, value = 0, state["n"]
    while isinstance(value, tuple):
        depth, value = depth + 1, value[0]
    assert (depth, value) == (200, "x")


@pytest.mark.parametrize("depth", [MAX_MSGPACK_DEPTH + 1, 20_000])
def test_tuples_nested_past_the_depth_limit_are_a_typed_error(root, depth):
    """Tuples nested past MAX_MSGPACK_DEPTH (20,000 levels: 40 KB) give LimitExceededError in load,
    a damaged row in log (exit 0, the other versions listed), a verify report naming the manifest, and resume either skips the version
    or raises that error; no reader crashes."""
    vid = commit_raw_manifest(root, _raw(root, nested_tuples(depth, "x")))
    rep = probe("load", root)
    assert rep["outcome"] == "error" and rep["error"] == "LimitExceededError", rep
    assert "nested deeper" in rep["message"] and vid in rep["message"]
    rep = probe("resume", root)
    assert (rep["outcome"] == "ok" and rep["version"] != vid) or rep["error"] == "LimitExceededError", rep
    rep = probe("cli", root, "log")
    assert rep["rc"] == 0 and "nested deeper" in rep["output"] and "1 damaged" in rep["output"], rep
    rep = probe("verify", root)
    assert rep["outcome"] == "ok" and not rep["ok"]
    assert any(obj == f"manifests/{vid}" and "nested deeper" in why for obj, why in rep["errors"]), rep


def test_4_mib_manifest_120_tuples_deep_reads_in_bounded_memory(root, template):
    """A 4 MiB string inside 120 tuples (a tree the writer accepts) reads back in log and load with a
    peak RSS at most 64 MiB above the same reader on the plain repository (it was ~500 MiB above)."""
    big = "x" * (4 << 20)
    data = _raw(root, nested_tuples(120, big))
    assert (4 << 20) < len(data) < (5 << 20)
    commit_raw_manifest(root, data)
    for mode, args in (("cli", ("log",)), ("load", ())):
        base = probe(mode, template, *args)
        rep = probe(mode, root, *args)
        assert rep["outcome"] != "error" and rep.get("rc", 0) == 0, rep
        assert rep["rss_mib"] - base["rss_mib"] < 64, (mode, rep["rss_mib"], base["rss_mib"])


def test_tuple_payloads_past_the_budget_are_refused_in_bounded_memory(root, template):
    """4 MiB inside 300 tuples copies 1.2 GiB when decoded level by level: readers refuse it with
    LimitExceededError (MAX_TUPLE_PAYLOAD_BYTES; log shows it as that version's damaged row) within
    64 MiB of RSS over a plain log."""
    leaf = b"y" * (4 << 20)
    assert 300 * len(leaf) > MAX_TUPLE_PAYLOAD_BYTES
    vid = commit_raw_manifest(root, _raw(root, nested_tuples(300, leaf)))
    base = probe("cli", template, "log")
    rep = probe("cli", root, "log")
    assert rep["rc"] == 0 and "nested tuples hold more than" in rep["output"], rep
    assert rep["rss_mib"] - base["rss_mib"] < 64, (rep["rss_mib"], base["rss_mib"])
    rep = probe("load", root)
    assert rep["error"] == "LimitExceededError" and vid in rep["message"], rep


def test_writer_refuses_a_tree_past_the_tuple_budget(root):
    """The writer applies the same budget before its first write, so it never commits a manifest that
    readers refuse: the save raises UnsupportedLeafError (from LimitExceededError), no pack is written
    and latest does not move."""
    before = latest(root)
    packs = sorted(os.listdir(os.path.join(root, "packs")))
    tree = "z" * (8 << 20)
    for _ in range(130):  # 130 x 8 MiB > 1 GiB
        tree = (tree,)
    with pytest.raises(UnsupportedLeafError, match="tuples"):
        deltackpt.save({"t": tree}, root)
    assert latest(root) == before
    assert sorted(os.listdir(os.path.join(root, "packs"))) == packs


def test_tuple_as_map_key_is_refused():
    """A tuple ext as a map key (writers key maps by str or int only) is CorruptObjectError."""
    body = {"parent": None, "time": 0.0, "tensors": [], "blobs": [],
            "tree": {nested_tuples(1, 1): 2}}
    with pytest.raises(deltackpt.errors.CorruptObjectError, match="map key"):
        manifest_fmt.decode(manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True))
