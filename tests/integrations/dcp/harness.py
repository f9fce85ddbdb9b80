"""Spawns the ranks of tests/integrations/dcp/worker.py as real processes in one gloo group (file:// rendezvous)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def run_ranks(tmp_path, mode: str, kind: str, world: int, repo: str, *, env_for_rank: dict | None = None,
              timeout: float = 240) -> tuple[list[int], list[dict | None], list[str]]:
    """Run ``world`` ranks to completion; returns (exit codes, each rank's JSON result or None, stderr)."""
    init = tmp_path / f"pg-{mode}-{kind}-{world}-{os.urandom(4).hex()}"
    procs, outs = [], []
    for rank in range(world):
        out = tmp_path / f"out-{init.name}-{rank}.json"
        outs.append(out)
        env = {**os.environ, "OMP_NUM_THREADS": "1", **((env_for_rank or {}).get(rank, {}))}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.integrations.dcp.worker", mode, kind, str(init), str(rank),
                                       str(world), repo, str(out)], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    codes, errs = [], []
    for p in procs:
        try:
            _o, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _o, err = p.communicate()
        codes.append(p.returncode)
        errs.append(err[-3000:])
    results = [json.loads(o.read_text()) if o.exists() else None for o in outs]
    return codes, results, errs
