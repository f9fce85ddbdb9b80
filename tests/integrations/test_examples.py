"""The examples run end to end (subprocess, small settings) and resume from their repositories."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import deltackpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script: str, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode in ok, f"{script} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_plain_loop_example(tmp_path):
    """examples/plain_loop.py trains, keeps the retained versions, and a second run resumes at its end."""
    repo = str(tmp_path / "r")
    out = _run("plain_loop.py", "--repo", repo, "--steps", "40", "--every", "10", "--hidden", "32")
    assert "fresh start" in out and "done at step 40" in out
    assert deltackpt.Repo(repo).resolve().step == 40 and len(deltackpt.Repo(repo).log()) <= 4
    out = _run("plain_loop.py", "--repo", repo, "--steps", "50", "--every", "10", "--hidden", "32")
    assert "resumed at step 40" in out and "done at step 50" in out


@pytest.mark.slow
def test_lightning_example(tmp_path):
    """examples/lightning_loop.py stores its checkpoints in the repository and --resume continues from last.ckpt."""
    pytest.importorskip("pytorch_lightning")
    repo = str(tmp_path / "r")
    assert "done at step 20" in _run("lightning_loop.py", "--repo", repo, "--steps", "20", "--every", "10")
    assert "done at step 30" in _run("lightning_loop.py", "--repo", repo, "--steps", "30", "--every", "10", "--resume")
    assert sorted({v.step for v in deltackpt.Repo(repo).log()}) == [10, 20, 30]


@pytest.mark.slow
def test_hf_trainer_example(tmp_path):
    """examples/hf_trainer.py "crashes" mid-run and --resume finishes from the repository."""
    pytest.importorskip("transformers")
    repo = str(tmp_path / "r")
    _run("hf_trainer.py", "--repo", repo, "--steps", "20", "--save-steps", "5", "--stop-at", "12", ok=(3,))
    assert deltackpt.Repo(repo).resolve().step == 10
    out = _run("hf_trainer.py", "--repo", repo, "--steps", "20", "--save-steps", "5", "--resume")
    assert "resuming from 10" in out and "done at step 20" in out


@pytest.mark.slow
def test_divergence_example_recovers_by_itself(tmp_path):
    """examples/divergence.py: a corrupted shard makes the loss spike; the guard rolls back once,
    skips it, and the run ends within 5% of the clean run's held-out loss (the unguarded one does
    not); the rollback is in the repository's log."""
    import json
    repo = str(tmp_path / "r")
    out = json.loads(_run("divergence.py", "--repo", repo, "--json"))
    assert out["ok"] and out["gap"] <= 0.05 and len(out["rollbacks"]) == 1
    assert out["unguarded"] > 10 * out["clean"]
    assert [e.kind for e in deltackpt.Repo(repo).events()] == ["rollback"]
