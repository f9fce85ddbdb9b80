"""Shared pieces of the hostile-file tests: a small real repository, a child-process probe of a
reader command (see _probe.py), and raw manifest writing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import msgpack
import pytest
import torch

import deltackpt
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format.ids import hex_id
from tests.conftest import ROOT


def make_repo(path: str, versions: int = 2) -> str:
    """A real repository of ``versions`` saves of a small state; returns its path."""
    for i in range(versions):
        g = torch.Generator().manual_seed(i)
        deltackpt.save({"w": torch.randn(64, 16, generator=g), "step": i}, path, step=i)
    return path


def latest(root: str) -> str:
    with open(os.path.join(root, "refs", "latest")) as f:
        return f.read().strip()


def probe(mode: str, repo: str, *args: str, timeout: float = 120) -> dict:
    """Run a reader in a child; return its report (outcome, error, message, ms, rss_mib, rc).

    A child killed by a signal (a segfault) or past ``timeout`` (a hang) fails the calling test."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.security._probe", mode, repo, *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{mode} {' '.join(args)} on {repo} hung (no answer in {timeout} s)") from None
    assert proc.returncode == 0, f"{mode} {' '.join(args)} died with {proc.returncode}:\n{proc.stderr[-3000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@ ")]
    assert lines, f"no report from the probe:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(lines[-1][3:])


def manifest_body(root: str) -> dict:
    """The latest manifest of ``root`` as the msgpack map its writer packed (tree included)."""
    vid = latest(root)
    with open(os.path.join(root, "manifests", vid), "rb") as f:
        m = manifest_fmt.decode(f.read(), version_id=vid)
    return {"parent": vid, "time": m.time + 1, "step": 99, "metrics": {}, "meta": None, "writer": "hostile",
            "extra": {}, "blobs": [b.to_obj() for b in m.blobs], "tensors": [t.to_obj() for t in m.tensors],
            "tree": {"w": msgpack.ExtType(manifest_fmt.EXT_TENSOR, msgpack.packb(0)), "step": 99}}


def commit_raw_manifest(root: str, data: bytes) -> str:
    """Store ``data`` as a manifest under its true id and point refs/latest at it; returns the id."""
    vid = hex_id(data)
    with open(os.path.join(root, "manifests", vid), "wb") as f:
        f.write(data)
    with open(os.path.join(root, "refs", "latest"), "w") as f:
        f.write(vid + "\n")
    return vid


def nested_tuples(depth: int, leaf: object) -> msgpack.ExtType:
    """``leaf`` inside ``depth`` tuples, as the tuple ext (type 2) a writer emits, built level by level
    (a writer's recursion would not reach the depths a stranger can write)."""
    ext = msgpack.ExtType(manifest_fmt.EXT_TUPLE, msgpack.packb([leaf], use_bin_type=True))
    for _ in range(depth - 1):
        ext = msgpack.ExtType(manifest_fmt.EXT_TUPLE, msgpack.packb([ext], use_bin_type=True))
    return ext


@pytest.fixture
def root(template: str, tmp_path) -> str:
    """A fresh copy of the test module's ``template`` repository (imported by each module)."""
    path = str(tmp_path / "repo")
    shutil.copytree(template, path)
    return path
