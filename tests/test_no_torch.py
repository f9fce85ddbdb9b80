"""The repository layers work without torch: a stranger's repository can be inspected safely."""

from __future__ import annotations

import subprocess
import sys

import torch

import deltackpt
from tests.conftest import ROOT

SCRIPT = r"""
import sys
sys.modules["torch"] = None  # any import of torch now raises ImportError
import deltackpt
repo = deltackpt.Repo(sys.argv[1])
assert len(repo.log()) == 2, repo.log()
report = repo.verify()
assert report.ok and report.chunks_checked > 0, report.to_json()
assert repo.du()["total"]["versions"] == 2
r = deltackpt.gc(repo, keep_last=1, grace_seconds=0)
assert len(r.removed) == 1
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None and m.split(".")[0] == "torch"]
print("ok")
"""


def test_open_verify_log_du_gc_without_torch(repo_path):
    """With torch blocked from importing, a repository opens, logs, verifies, sizes and collects."""
    deltackpt.save({"w": torch.randn(100, 100)}, repo_path)
    deltackpt.save({"w": torch.randn(100, 100)}, repo_path)
    out = subprocess.run([sys.executable, "-c", SCRIPT, repo_path], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
