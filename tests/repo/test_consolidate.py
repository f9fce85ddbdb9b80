"""Index files stay few: a new process opens a repository of many versions with a bounded number of
reads (repo/write/consolidate.py), and a merge killed halfway leaves every version readable."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import deltackpt
from deltackpt.repo.write.consolidate import MAX_INDEX_FILES
from deltackpt.store.counting import CountingStore
from deltackpt.store.local import LocalStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _index_files(path: str) -> list[str]:
    return os.listdir(os.path.join(path, "index"))


def test_opening_a_repository_of_many_versions_reads_few_index_files(repo_path):
    """60 saves, no gc: at most MAX_INDEX_FILES + 1 index files at any time, a fresh handle reads
    no more than that many, and every version loads."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    saved = []
    for step in range(60):
        w = w + 0.01 * torch.randn(64, 64, generator=g)
        saved.append(deltackpt.save({"w": w, "step": step}, repo_path, step=step))
        assert len(_index_files(repo_path)) <= MAX_INDEX_FILES + 1
    counting = CountingStore(LocalStore(repo_path))
    repo = deltackpt.Repo(counting)
    assert len([k for k in counting.keys_read if k.startswith("index/")]) <= MAX_INDEX_FILES + 1
    for step in (0, 30, 59):
        assert repo.load(saved[step].id)["step"] == step
    assert repo.verify().ok


def test_a_merge_killed_before_deleting_the_old_files_leaves_every_version_readable(repo_path):
    """SIGKILL right after the merged index file is written, before the files it replaces go: both
    name the same packs, every version loads, and the next save merges again."""
    script = f"""
import sys, torch
sys.path.insert(0, {ROOT!r})
import deltackpt
for step in range({MAX_INDEX_FILES + 2}):
    deltackpt.save({{"w": torch.full((16,), float(step))}}, {repo_path!r}, step=step)
"""
    env = {**os.environ, "DELTACKPT_FAULT": "consolidate.delete:1:kill"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == -9, out.stderr
    files = len(_index_files(repo_path))
    assert files > MAX_INDEX_FILES + 1  # the merged file beside the ones it replaces
    repo = deltackpt.Repo(repo_path)
    for v in repo.log():
        assert torch.equal(repo.load(v.id)["w"], torch.full((16,), float(v.step)))
    assert repo.verify().ok
    deltackpt.save({"w": torch.zeros(16)}, repo_path)
    assert len(_index_files(repo_path)) <= 2
