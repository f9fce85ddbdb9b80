"""Rollback drills: a version restored into fresh memory, checked against its hashes, measured and
recorded; a damaged one is a failed drill naming the chunk; the Checkpointer drills in the
background at idle priority and hands the measured restore time to YoungDaly; the CLI drills too."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

import deltackpt
from deltackpt import priority
from deltackpt.repo.maintain import events
from deltackpt.training import Checkpointer, training_state
from deltackpt.training.policies import AnyOf, EveryN, YoungDaly
from tests.conftest import run_cli


def _repo(path: str, versions: int = 3) -> list:
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)
    out = []
    for i in range(versions):
        with torch.no_grad():
            model.weight.add_(0.01)
        out.append(deltackpt.save({"model": model.state_dict(), "step": i}, path, step=i))
    return out


def _damage_latest(path: str) -> None:
    """Flip a bit inside the object holding the newest version's first chunk."""
    core = deltackpt.Repo(path).core
    chunk = core.manifest(core.latest()).blobs[0].chunks[0].chunk_id
    pid, entry = core.index.entry(chunk)
    with open(os.path.join(path, "packs", pid[:2], pid), "r+b") as f:
        f.seek(entry.offset + entry.length - 5)
        b = f.read(1)
        f.seek(entry.offset + entry.length - 5)
        f.write(bytes([b[0] ^ 0x40]))


def test_drill_restores_checks_measures_and_records(repo_path):
    versions = _repo(repo_path)
    repo = deltackpt.Repo(repo_path)
    report = repo.drill("latest~1")
    assert report.ok and report.error is None and report.version == versions[1].id
    assert report.logical_bytes == versions[1].logical_bytes and report.chunks >= 2
    assert report.bytes_read > 0 and report.seconds > 0 and report.cpu_seconds >= 0
    (e,) = events.usable(repo.core, "drill")
    assert e.id == report.event and e.data["seconds"] == report.seconds and e.data["revision"] == "latest~1"
    assert repo.show("latest~1")["last_drill"]["id"] == report.event
    assert repo.show("latest")["last_drill"] is None


def test_a_damaged_version_is_a_failed_drill(repo_path):
    _repo(repo_path)
    _damage_latest(repo_path)
    report = deltackpt.Repo(repo_path).drill()
    assert not report.ok and "chunk" in report.error and "CorruptObjectError" in report.error
    assert events.last(deltackpt.Repo(repo_path).core, "drill").data["ok"] is False


def test_checkpointer_drills_in_the_background_and_feeds_young_daly(repo_path, monkeypatch):
    """drill_every=2: every second save is drilled in a thread put under SCHED_IDLE; the measured
    restore time reaches YoungDaly at the next step (in the training thread) and a Checkpointer
    opened later reads it back from the repository."""
    idle_calls = []
    real = priority.run_idle
    monkeypatch.setattr(priority, "run_idle", lambda idle: (idle_calls.append(idle), real(idle))[1])
    model = torch.nn.Linear(64, 64)
    policy = YoungDaly(mtbf=3600.0, initial_cost=0.01)
    ckpt = Checkpointer(repo_path, AnyOf(EveryN(1), policy), blocking=True, drill_every=2)
    for step in range(1, 5):
        ckpt.step(training_state(model=model, step=step), step=step)
        if step == 2:
            # a drill still running when the next one is due is skipped, by design; at idle
            # priority on a busy machine the first may outlast two saves
            ckpt.drills.wait()
    ckpt.wait()
    assert ckpt.drills.last is not None and ckpt.drills.last.ok and True in idle_calls
    drills = events.usable(deltackpt.Repo(repo_path).core, "drill")
    assert len(drills) == 2 and {e.data["revision"] for e in drills} == {"latest"}
    ckpt.step(training_state(model=model, step=5), step=5)
    assert policy.restore == ckpt.drills.last.seconds
    ckpt.close()
    later = YoungDaly(mtbf=3600.0)
    Checkpointer(repo_path, later).close()
    assert later.restore == drills[0].data["seconds"]


def test_young_daly_uses_the_restart_cost():
    p = YoungDaly(mtbf=800.0, initial_cost=1.0, restart_cost=100.0)
    assert p.interval == pytest.approx(math.sqrt(2 * 900.0))
    p.restore_measured(100.0)
    assert p.interval == pytest.approx(40.0 * math.sqrt(1000.0 / 800.0) / math.sqrt(1.0))
    p.restore_measured(float("nan"))
    assert p.restore == 100.0 and "measured restore 100" in p.describe()


def test_cli_drill_json_log_and_show(tmp_path):
    path = str(tmp_path / "r")
    versions = _repo(path)
    proc = run_cli("drill", "latest~2", "--repo", path, "--json")
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["version"] == versions[0].id and out["event"]
    text = run_cli("log", "--repo", path).stdout
    assert f"last drill of {versions[0].short_id} (latest~2)" in text and "restored bit-identical" in text
    assert "drill   drill of" in run_cli("show", versions[0].short_id, "--repo", path).stdout
    events_out = json.loads(run_cli("events", "--repo", path, "--json").stdout)
    assert [e["kind"] for e in events_out] == ["drill"]
    _damage_latest(path)
    bad = run_cli("drill", "--repo", path, "--json", check=False)
    assert bad.returncode == 1 and json.loads(bad.stdout)["ok"] is False
    missing = run_cli("drill", "nosuch", "--repo", path, check=False)
    assert missing.returncode == 3 and missing.stderr.count("\n") == 1 and "nosuch" in missing.stderr
