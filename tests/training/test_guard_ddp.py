"""The divergence guard under torch.distributed: two real processes train one model with
DistributedDataParallel over gloo; a fault shows on ONE rank's loss only.  Both ranks roll back at
the same step to the same version (chosen by rank 0), only rank 0 commits the restored state and
records the event, and both end with bit-identical weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import deltackpt
from deltackpt.repo.maintain import events
from tests.conftest import ROOT


def _run_ranks(tmp_path, repo: str, fault_rank: int) -> list[dict]:
    deltackpt.Repo.init(repo)           # created once, before the ranks open it
    store = str(tmp_path / "store")
    outs = [str(tmp_path / f"rank{r}.json") for r in (0, 1)]
    env = {**os.environ, "PYTHONPATH": ROOT, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.training.ddp_child", str(r), store, repo, outs[r],
                               str(fault_rank)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in (0, 1)]
    deadline = time.monotonic() + 240
    try:
        for p in procs:
            p.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [p.stdout.read().decode(errors="replace") for p in procs]
    for p in procs:
        p.stdout.close()
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(log[-3000:] for log in logs)
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    results[0]["log"], results[1]["log"] = logs
    return results


@pytest.mark.parametrize("fault_rank", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_a_fault_on_one_rank_rolls_every_rank_back_together(tmp_path, repo_path, fault_rank):
    r0, r1 = _run_ranks(tmp_path, repo_path, fault_rank)
    assert len(r0["rollbacks"]) == len(r1["rollbacks"]) == 1
    (a,), (b,) = r0["rollbacks"], r1["rollbacks"]
    for key in ("from_step", "bad_start", "step", "version", "seen_on", "rule"):
        assert a[key] == b[key], key
    assert (a["from_step"], a["bad_start"], a["step"], a["seen_on"], a["rule"]) == (23, 23, 20, fault_rank, "spike")
    assert a["committed"] is not None and a["event"] is not None   # rank 0 commits and records
    assert b["committed"] is None and b["event"] is None           # rank 1 only restores
    assert r0["weights"] == r1["weights"] and r0["step"] == r1["step"] == 40
    repo = deltackpt.Repo(repo_path)
    (e,) = events.usable(repo.core, "rollback")
    assert (e.data["version"], e.data["to_step"], e.data["committed"]) == (a["version"], 20, a["committed"])
    assert repo.resolve(a["committed"]).meta["rollback"]["to"] == a["version"]
    # one line, logged once (by rank 0), naming the rank that saw the fault
    lines = [ln for r in (r0, r1) for ln in r["log"].splitlines() if ln.startswith("deltackpt: rollback")]
    assert len(lines) == 1 and f"on rank {fault_rank}" in lines[0] and a["version"][:10] in lines[0]
