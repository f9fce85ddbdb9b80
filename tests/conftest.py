"""Shared fixtures.  Hypothesis profile: DELTACKPT_HYPOTHESIS=default|ci|nightly (CI sets ci)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("nightly", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("DELTACKPT_HYPOTHESIS", "ci" if os.environ.get("CI") else "default"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# saves deltify older versions in a background thread; a test that counts packs, bytes or objects
# must not race it, so the suite (and the processes it starts) turns it off and deltifies on purpose
# (tests/repo/test_deltify.py runs the background thread itself)
os.environ["DELTACKPT_DELTIFY"] = "off"


@pytest.fixture
def repo_path(tmp_path):
    """A path for a fresh repository (created on first save)."""
    return str(tmp_path / "repo")


@pytest.fixture(autouse=True)
def _fresh_handles():
    """Each test starts with no cached repository handles (and so no delta cache)."""
    from deltackpt import api
    api._OPEN.clear()
    yield
    api._OPEN.clear()


def run_cli(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real ``deltackpt`` command in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "deltackpt.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"deltackpt {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def file_digests(root: str) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha1 of its bytes): equal before and after means
    an operation wrote nothing."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for n in files:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = hashlib.sha1(f.read()).hexdigest()
    return out


def proc_state(pid: int) -> str:
    """The one-letter state of process ``pid`` (``T`` stopped, ``Z`` zombie, ...), or ``"gone"``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
