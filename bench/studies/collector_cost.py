"""The interpreter's cyclic collector: what a load and a blocking save leave it to do.

CPython runs a full collection, which scans every tracked object of the process (after ``import
torch`` and transformers, about 425,000: ~200 ms here), once enough objects have survived two
young collections since the last one (a quarter of the objects the last full collection found).
Every object a call keeps alive across a young collection counts toward that line, including
objects that die when the call returns.  This study counts them exactly:

* ``headroom``: right after ``gc.collect()``, the lists kept alive until the next full collection
  starts (the line's distance);
* per call (a load of the newest version, then a blocking save of a trained state): the headroom,
  ``gc.collect()``, the call, then the headroom again; the difference is what the call left
  counted, and the young collections that ran inside it are counted through ``gc.callbacks``.

Each system runs in a fresh process that builds its own repository (three versions of the
workload a few training steps apart) in a scratch folder.  ``--baseline DIR`` runs the
deltackpt package under DIR (a ``git archive`` of an older commit) too, in the same run.

    python -m bench collector_cost --quick                                # a tiny model, checks only
    python -m bench collector_cost [--workload minilm] [--baseline DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:   # run as a script in the child processes
    sys.path.insert(0, ROOT)
from bench.common.scratch import scratch  # noqa: E402

SUMMARY = "what a load and a blocking save leave the cyclic collector: young collections, objects counted toward the next full one"
WRITES = "stdout; --json FILE (stop 45's run: bench/results/collector_cost.json)"


def _headroom(started: list[int]) -> int:
    """Lists kept alive until the next full collection starts (then freed again)."""
    full = started.count(2)
    keep = []
    while started.count(2) == full:
        keep.append([])
    n = len(keep)
    del keep
    return n


def _measure(workload: str, folder: str) -> dict:
    import gc

    import torch

    import deltackpt
    from bench.studies.load_speed import _loss, _model
    torch.set_num_threads(1)
    model, batch = _model(workload)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def trained() -> dict:
        opt.zero_grad()
        _loss(workload, model, batch()).backward()
        opt.step()
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}
    started: list[int] = []
    gc.callbacks.append(lambda phase, info: started.append(info["generation"]) if phase == "start" else None)
    out: dict[str, Any] = {}
    with deltackpt.Repo(os.path.join(folder, "repo"), create=True) as repo:
        for step in range(3):
            repo.save(trained(), step=step)
        state = trained()
        gc.collect()
        t0 = time.perf_counter()
        gc.collect()
        out["full_collection_s"] = time.perf_counter() - t0
        out["tracked_objects"] = len(gc.get_objects())
        for name, call in (("load", lambda: repo.load()), ("blocking save", lambda: repo.save(state, step=10))):
            gc.collect()
            headroom = _headroom(started)   # with what earlier calls kept, before this call
            gc.collect()
            before = len(started)
            kept = call()
            young = len(started) - before
            left = headroom - _headroom(started)
            del kept
            out[name] = {"young_collections": young, "left_counted": left, "headroom": headroom}
        out["headroom"] = out["load"]["headroom"]
    return out


def _child(workload: str, folder: str, source: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), workload, folder], env=env, cwd=folder,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"collector_cost child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, baseline: str | None, tmp: str | None = None) -> dict:
    systems = {"deltackpt": ROOT, **({"deltackpt-before": os.path.abspath(baseline)} if baseline else {})}
    out = {}
    with scratch("collector-cost-", parent=tmp) as folder:
        for name, source in systems.items():
            sub = os.path.join(folder, name)
            os.makedirs(sub)
            out[name] = _child(workload, sub, source)
    return out


def report(workload: str, result: dict) -> str:
    lines = [f"workload {workload}", "",
             "| system | tracked objects | a full collection | headroom after one (objects) | load: young collections "
             "| load: objects left counted | blocking save: young collections | blocking save: objects left counted |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in result.items():
        lines.append(f"| {name} | {r['tracked_objects']:,} | {r['full_collection_s'] * 1e3:.0f} ms | {r['headroom']:,} | "
                     f"{r['load']['young_collections']} | {r['load']['left_counted']:,} | "
                     f"{r['blocking save']['young_collections']} | {r['blocking save']['left_counted']:,} |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="minilm", choices=("minilm", "cnn", "gpt2"))
    p.add_argument("--baseline", help="folder holding another deltackpt package to count in the same run")
    p.add_argument("--json", help="write the results here")


def run(a: argparse.Namespace) -> int:
    workload = "tiny" if a.quick else a.workload
    result = measure(workload, None if a.quick else a.baseline, a.tmp)
    r = result["deltackpt"]
    assert r["headroom"] > 0 and r["load"]["left_counted"] <= r["headroom"], r
    print(report(workload, result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    print(json.dumps(_measure(sys.argv[1], sys.argv[2])))
