"""deltackpt.dcp.Writer/Reader under torch.distributed.checkpoint: single process, and real gloo
process groups on CPU (2 and 4 ranks; replicated, DTensor-sharded and FSDP2 state), resharding
to another world size, and a rank killed mid-save."""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

import deltackpt
import deltackpt.dcp
from deltackpt.api import Repo

from tests.conftest import ROOT

from .harness import run_ranks

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 4))
    return {"model": model.state_dict(), "step": seed, "sched": {"lr": 0.1 * seed, "milestones": [1, 2]}}


def _zeros(state: dict) -> dict:
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": -1,
            "sched": {"lr": 0.0, "milestones": []}}


def test_single_process_save_and_load_roundtrip(repo_path):
    """dcp.save with a Writer commits one version; dcp.load with a Reader fills the state bit-exactly,
    non-tensor values included."""
    state = _state(3)
    writer = deltackpt.dcp.Writer(repo_path, step=3, metrics={"loss": 1.5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=writer)
        back = _zeros(state)
        dcp.load(back, storage_reader=deltackpt.dcp.Reader(repo_path))
    for k, v in state["model"].items():
        assert torch.equal(v, back["model"][k])
    assert back["step"] == 3 and back["sched"] == state["sched"]
    repo = Repo(repo_path)
    assert [v.id for v in repo.log()] == [writer.version_id]
    assert repo.resolve("latest").step == 3 and repo.resolve("latest").metrics == {"loss": 1.5}
    assert repo.verify().ok


def test_reader_loads_older_revisions_and_unchanged_tensors_are_not_rewritten(repo_path):
    """A second DCP save of a partly changed state writes only the changed chunks, and
    Reader(version="latest~1") still loads the first state."""
    first, second = _state(1), _state(1)
    second["model"]["1.bias"] = second["model"]["1.bias"] + 1
    w = deltackpt.dcp.Writer(repo_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(first, storage_writer=w)
        full = w.last_stats.objects_bytes
        dcp.save(second, storage_writer=w)
        assert 0 < w.last_stats.objects_bytes < full / 4
        back = _zeros(first)
        dcp.load(back, storage_reader=deltackpt.dcp.Reader(repo_path, version="latest~1"))
    assert torch.equal(back["model"]["1.bias"], first["model"]["1.bias"])


def test_reader_refuses_a_version_not_written_by_dcp(repo_path):
    """Reader on a version saved with deltackpt.save raises StateMismatchError naming the version
    (DCP wraps it in its CheckpointException, the message kept)."""
    from torch.distributed.checkpoint.api import CheckpointException

    v = deltackpt.save({"w": torch.ones(3)}, repo_path)
    with pytest.raises(deltackpt.StateMismatchError, match=v.id[:10]):
        deltackpt.dcp.Reader(repo_path).read_metadata()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointException, match="not written by deltackpt.dcp.Writer"):
            dcp.load({"w": torch.zeros(3)}, storage_reader=deltackpt.dcp.Reader(repo_path))


def _check_saved(codes, results, errs, repo: str, world: int) -> None:
    assert codes == [0] * world, errs
    for r in results:
        assert r["roundtrip0"] and r["roundtrip1"], r
    log = Repo(repo).log()
    assert [v.id for v in log] == [results[0]["version1"], results[0]["version0"]]
    # the incremental version wrote less than the first, summed over every rank (the FSDP variant
    # changes every parameter, so its deltas land near half: the bound leaves room for codec choices)
    assert sum(r["written1"] for r in results) < 0.75 * sum(r["written0"] for r in results)
    assert Repo(repo).verify().ok


def test_two_ranks_dtensor_sharded_save_and_load(tmp_path):
    """Two gloo ranks save DTensor-sharded and replicated state through DCP into one version per
    save (the coordinator commits), and load it back bit-exactly."""
    repo = str(tmp_path / "repo")
    _check_saved(*run_ranks(tmp_path, "save", "dtensor", 2, repo), repo, 2)


@pytest.mark.slow
@pytest.mark.parametrize("kind,world", [("plain", 2), ("plain", 4), ("dtensor", 4), ("fsdp", 2), ("fsdp", 4)])
def test_ranks_save_and_load(tmp_path, kind, world):
    """Replicated (DDP-like), DTensor and FSDP2 state saved by 2 or 4 gloo ranks round-trips exactly."""
    repo = str(tmp_path / "repo")
    _check_saved(*run_ranks(tmp_path, "save", kind, world, repo), repo, world)


@pytest.mark.slow
def test_replicated_tensors_are_stored_once(tmp_path):
    """A model replicated on 4 ranks (as under DDP) adds its bytes to the repository once, not 4 times."""
    repo = str(tmp_path / "repo")
    codes, results, errs = run_ranks(tmp_path, "save", "plain", 4, repo)
    assert codes == [0] * 4, errs
    core = Repo(repo).core
    m = core.manifest(results[0]["version0"])
    model_chunks = {c.chunk_id for t in m.tensors if t.name.startswith("model.") for c in m.blobs[t.blob].chunks}
    model_bytes = sum(t.nbytes for t in m.tensors if t.name.startswith("model."))
    per_rank = [t for t in m.tensors if t.name.startswith("model.")]
    assert len(per_rank) == 4  # two Linear layers, weight and bias: one entry each, not one per rank
    assert core.index.stored_size(model_chunks) <= model_bytes * 1.05


@pytest.mark.slow
@pytest.mark.parametrize("saved,loaded", [(4, 2), (2, 4), (4, 3)])
def test_resharding_to_another_world_size(tmp_path, saved, loaded):
    """DTensor state saved by N ranks loads into M ranks' sharding with the same global values."""
    repo = str(tmp_path / "repo")
    codes, _r, errs = run_ranks(tmp_path, "save", "dtensor", saved, repo)
    assert codes == [0] * saved, errs
    codes, results, errs = run_ranks(tmp_path, "load", "dtensor", loaded, repo)
    assert codes == [0] * loaded, errs
    assert all(r["resharded"] for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("site", ["pack.write:1:kill", "index.write:1:kill"])
def test_rank_killed_mid_save_commits_nothing(tmp_path, site):
    """When one of two ranks is SIGKILLed while writing its chunks, no version appears, the
    repository verifies, and a later save by a fresh group works."""
    repo = str(tmp_path / "repo")
    codes, _r, _e = run_ranks(tmp_path, "save", "plain", 2, repo, env_for_rank={1: {"DELTACKPT_FAULT": site}},
                              timeout=120)
    assert codes[1] == -9
    assert codes[0] != 0  # the coordinator saw its peer vanish and did not commit
    r = Repo(repo)
    assert r.log() == []
    assert r.verify().ok
    codes, results, errs = run_ranks(tmp_path, "save", "plain", 2, repo)
    assert codes == [0, 0], errs
    assert len(Repo(repo).log()) == 2


_RANK_IN_ANOTHER_FOLDER = """
import pickle, sys, warnings
import torch, torch.distributed.checkpoint as dcp
warnings.simplefilter("ignore")
writer, reader = pickle.load(open(sys.argv[1], "rb"))
state = {"w": torch.arange(6.0), "step": 7}
dcp.save(state, storage_writer=writer)
back = {"w": torch.zeros(6), "step": -1}
dcp.load(back, storage_reader=reader)
assert torch.equal(back["w"], state["w"]) and back["step"] == 7, back
print(writer.version_id)
"""


@pytest.mark.parametrize("how", ["str", "pathlike"])
def test_writer_and_reader_made_with_a_relative_path_pickle_as_an_absolute_one(tmp_path, monkeypatch, how):
    """issue 23 item 8: Writer("rel") and Reader("rel") made in folder A, pickled, and used by a real
    process whose working folder is B commit into (and read from) A/rel, as a pickled Repo does; they
    used to create B/rel."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.chdir(a)
    rel = "rel" if how == "str" else pathlib.Path("rel")
    blob = tmp_path / "storage.pkl"
    blob.write_bytes(pickle.dumps((deltackpt.dcp.Writer(rel, step=7), deltackpt.dcp.Reader(rel))))
    proc = subprocess.run([sys.executable, "-c", _RANK_IN_ANOTHER_FOLDER, str(blob)], cwd=b, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    assert not (b / "rel").exists()
    assert [v.id for v in Repo(str(a / "rel")).log()] == [proc.stdout.split()[-1]]
