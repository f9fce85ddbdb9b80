"""A hostile repository against the readers that list and pick versions (issue 16, items 12 and 15):
odd values in manifest fields readers do not need for the data (``extra.written.bytes``, ``time``)
and damaged manifests degrade ``log``, ``log --json`` and ``resume`` per version, never as a whole;
``verify`` refuses every version ``load`` refuses.  Manifests are crafted as real files under
their content-hash ids in a real repository, and the CLI runs as a real subprocess."""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings

import msgpack
import pytest
import torch

import deltackpt
from deltackpt.errors import CorruptObjectError
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format.ids import hex_id
from deltackpt.training import resume, training_state
from tests.conftest import run_cli
from tests.security._hostile import commit_raw_manifest

ODD = {"nan": math.nan, "huge": 1e20, "inf": math.inf, "text": "many", "fraction": 1.5, "negative": -5,
       "map": {"n": 1}}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Two training-state versions (steps 0 and 1) of a small model."""
    path = str(tmp_path_factory.mktemp("readers") / "repo")
    model = _model()
    for step in range(2):
        with torch.no_grad():
            model.weight.add_(0.5)
        deltackpt.save(training_state(model=model, step=step), path, step=step)
    return path


@pytest.fixture
def root(template, tmp_path):
    path = str(tmp_path / "repo")
    shutil.copytree(template, path)
    return path


def _latest(root: str) -> str:
    with open(os.path.join(root, "refs", "latest")) as f:
        return f.read().strip()


def _body(root: str, vid: str) -> dict:
    with open(os.path.join(root, "manifests", vid), "rb") as f:
        return msgpack.unpackb(f.read()[len(manifest_fmt.MAGIC):], raw=False, strict_map_key=False)


def _commit_crafted(root: str, body: dict) -> str:
    """Write ``body`` as a manifest under its hash id and move ``latest`` to it (a committed version)."""
    return commit_raw_manifest(root, manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True))


def _newest_with(root: str, edit) -> tuple[str, str]:
    """A third version: the newest one's manifest (step 2, newest time) edited by ``edit(body)``."""
    old = _latest(root)
    body = _body(root, old)
    body.update(parent=old, step=2, time=body["time"] + 10)
    edit(body)
    return old, _commit_crafted(root, body)


def _one_error_line(proc) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert len(proc.stderr.strip().splitlines()) <= 1, proc.stderr


CASES = [("written", odd) for odd in ODD] + [("time", odd) for odd in ("nan", "huge", "inf", "text", "map")]


@pytest.mark.parametrize("field,odd", CASES)
def test_odd_optional_field_is_shown_as_unknown_and_the_version_still_loads(root, field, odd):
    """A manifest whose ``extra.written.bytes`` (NaN, 1e20, inf, text, a fraction, a negative, a map)
    or ``time`` (NaN, 1e20, inf) is odd lists in ``log`` (text and --json, exit 0, "?" for the odd
    field), loads, and is what ``resume`` restores; a ``time`` that is not a number (text, a map)
    fails the schema and is one damaged row while the other versions are listed."""
    value = ODD[odd]

    def edit(body):
        if field == "written":
            body["extra"]["written"]["bytes"] = value
        else:
            body["time"] = value

    _old, vid = _newest_with(root, edit)
    schema_refuses = field == "time" and not isinstance(value, (int, float))
    proc = run_cli("log", "--repo", root, check=False)
    assert proc.returncode == 0, proc.stderr
    _one_error_line(proc)
    row = next(line for line in proc.stdout.splitlines() if line.startswith(vid[:10]))
    assert "DAMAGED" in row if schema_refuses else "?" in row
    assert len([line for line in proc.stdout.splitlines()[2:] if line.strip()]) == 3
    rows = json.loads(run_cli("log", "--repo", root, "--json").stdout)
    mine = next(r for r in rows if r["id"] == vid)
    assert len(rows) == 3
    if schema_refuses:
        assert "time is not a number" in mine["error"]
        return
    assert mine["error"] is None and mine["written_bytes" if field == "written" else "time_iso"] is None
    assert deltackpt.load(root, vid)["step"] == 1
    info = resume(root, model=_model())
    assert info.version.id == vid and info.skipped == []


@pytest.mark.parametrize("damage", ["schema", "hash"])
def test_damaged_newest_manifest_is_a_log_row_and_resume_falls_back(root, damage):
    """The newest manifest failing its schema (time as text) or its hash is one DAMAGED row of
    ``log`` (the others listed, exit 0) and ``resume`` skips it with a warning, restoring the one before."""
    old = _latest(root)
    if damage == "schema":
        _old, vid = _newest_with(root, lambda body: body.update(time="yesterday"))
    else:
        _old, vid = _newest_with(root, lambda body: None)
        with open(os.path.join(root, "manifests", vid), "r+b") as f:
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 0x40]))
    listed = deltackpt.Repo(root).log()
    assert {v.id for v in listed if v.error is None} == {old, _body(root, old)["parent"]}
    assert [v.id for v in listed if v.error is not None] == [vid]
    proc = run_cli("log", "--repo", root, check=False)
    assert proc.returncode == 0 and "DAMAGED" in proc.stdout and old[:10] in proc.stdout
    _one_error_line(proc)
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = resume(root, model=model)
    assert info.version.id == old and info.skipped == [vid]
    assert any(vid[:10] in str(w.message) for w in caught)
    assert torch.equal(model.weight, deltackpt.load(root, old)["model"]["weight"])


def test_best_revision_ignores_a_damaged_manifest(root):
    """``best:METRIC`` picks among the usable versions when another version's manifest is damaged."""
    old = _latest(root)
    _newest_with(root, lambda body: body.update(time="yesterday"))
    body = _body(root, old)
    body.update(parent=old, metrics={"val": 0.5}, time=body["time"] + 1)
    good = hex_id(manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True))
    with open(os.path.join(root, "manifests", good), "wb") as f:
        f.write(manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True))
    assert deltackpt.Repo(root).resolve("best:val").id == good


def test_verify_refuses_a_chunk_length_the_index_disagrees_with(root):
    """A manifest whose chunk length (and blob size and shape, kept consistent) disagrees with the
    index entry is refused by load, and verify (API and CLI, --quick too) names that version."""
    old = _latest(root)

    def shrink(body):
        t = next(t for t in body["tensors"] if t["name"].endswith("bias"))
        blob = body["blobs"][t["blob"]]
        assert len(blob["chunks"]) == 1 and t["shape"] == [4]
        blob["chunks"][0][1] -= 4
        blob["nbytes"] -= 4
        t["shape"] = [3]

    _old, vid = _newest_with(root, shrink)
    with pytest.raises(CorruptObjectError, match="manifest says 12 bytes, the index 16"):
        deltackpt.load(root, vid)
    report = deltackpt.Repo(root).verify()
    assert not report.ok and report.bad_versions == [vid]
    assert any("manifest says 12 bytes" in p.problem for p in report.errors)
    assert deltackpt.Repo(root).verify(read_data=False).bad_versions == [vid]
    proc = run_cli("verify", "--repo", root, check=False)
    assert proc.returncode == 1 and f"bad versions: {vid[:10]}" in proc.stdout


def test_quick_verify_refuses_an_encoding_id_no_codec_owns(root):
    """verify --quick (no decoding) still flags index entries whose encoding id load would refuse."""
    from tests.security._hostile_env import _replace, _rewrite_index
    _rewrite_index(root, lambda pid, plen, es: [_replace(e, encoding=200) for e in es])
    with pytest.raises(CorruptObjectError, match="disagrees with the index"):
        deltackpt.load(root, _latest(root))
    report = deltackpt.Repo(root).verify(read_data=False)
    assert not report.ok and _latest(root) in report.bad_versions
    assert any("unknown encoding id 200" in p.problem for p in report.errors)


def test_a_limited_log_decodes_only_the_versions_it_lists(root):
    """``log(limit=N)`` and ``deltackpt log -n N`` list the newest N as the whole log does, and read
    no more of the others than their time: a version older than those, whose blob list is malformed
    (a negative size), is a damaged row of the whole log and absent from the limited one."""
    newest = _latest(root)
    body = _body(root, newest)
    body.update(parent=None, step=-1, time=body["time"] - 100)
    body["blobs"][0]["nbytes"] = -1
    bad = hex_id(manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True))
    with open(os.path.join(root, "manifests", bad), "wb") as f:
        f.write(manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True))
    whole = deltackpt.Repo(root).log()
    assert [v.id for v in whole][-1] == bad and "nbytes" in whole[-1].error
    assert [v.error for v in whole[:-1]] == [None, None]
    limited = deltackpt.Repo(root).log(limit=2)
    assert [v.to_json() for v in limited] == [v.to_json() for v in whole[:2]]
    proc = run_cli("log", "--repo", root, "-n", "2", "--json")
    assert [r["id"] for r in json.loads(proc.stdout)] == [v.id for v in whole[:2]]
    proc = run_cli("log", "--repo", root, "-n", "-1", check=False)
    assert proc.returncode != 0 and "limit" in proc.stderr
    _one_error_line(proc)
