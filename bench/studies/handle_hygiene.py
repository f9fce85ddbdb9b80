"""What a repository handle leaves behind once the call that used it returned: threads, writes into
the folder, resident memory.

Three measures, each on real saves:

* ``rmtree``: the ordinary script: four ``deltackpt.save(model, folder, step=s)`` calls (the module
  level API, no handle kept), then ``shutil.rmtree(folder)`` at once; a trial fails if rmtree
  raises or if the folder exists again 0.2 s later.  Counts deltackpt threads alive after each
  trial, and after a child script that simply ends (its threads listed at exit).
* ``memory``: real jobs' states (MiniLM full fine-tune with AdamW, ~272 MB; the SparseAdam
  recommender, ~308 MB; ``--jobs``) saved through one ``Repo``, with the default
  ``delta_cache_bytes`` and with 0: resident memory above the live state after a blocking save
  returns (and how much of it the delta cache holds), after a background save's ``wait()``, after
  ``close()``, with two repositories open; and what the cache buys: a later save's CPU and the
  bytes it reads back.  Resident memory is read with malloc's free pages handed back
  (bench/common/memory.py), and what the job's own training steps between the measurements add
  (each step measured alone) is taken out: before stop 41 it was not, and the figures after
  ``close()`` swung from 0.02 to 0.33x of the state between runs of the same code.  Each figure
  is split (stop 42): the part live allocations hold (malloc's bytes in use, ``mallinfo2``) and
  the rest, which glibc keeps for reuse at the top of the encoder threads' arenas (``malloc_trim``
  hands back only the main arena's top).
* ``threads``: deltackpt threads alive after each step above (must be 0 once a call returned
  without a handle, or once ``close()`` returned).

    python -m bench handle_hygiene                 # 100 rmtree trials, MiniLM full and recsys (~3 minutes)
    python -m bench handle_hygiene --quick         # CI: 10 trials, a tiny state
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

from bench.common.measure import proc_io
from bench.common.memory import malloc_in_use, settled_rss
from bench.common.record import record
from bench.common.scratch import scratch

SUMMARY = "threads, writes and resident memory a handle leaves after save/close; rmtree right after saves"
WRITES = "stdout; --record KEY: bench/results/handle_hygiene.json"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trials", type=int, default=None, help="rmtree trials (default 100, quick 10)")
    ap.add_argument("--jobs", default="minilm-full,recsys",
                    help="the states the memory measure saves (bench/common/jobs.py; quick: minilm-full)")
    ap.add_argument("--record", help="store the results under this key")


def _ours() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("deltackpt"))


def _rmtree_trials(n: int, work: str) -> dict:
    import torch

    import deltackpt
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    failed = back = 0
    leftover: list[str] = []
    for t in range(n):
        folder = os.path.join(work, f"r{t}")
        for s in range(4):
            with torch.no_grad():
                model[0].weight.add_(0.01)
            deltackpt.save(model, folder, step=s)
        try:
            shutil.rmtree(folder)
        except OSError:
            failed += 1
        time.sleep(0.2)
        if os.path.exists(folder):
            back += 1
            shutil.rmtree(folder, ignore_errors=True)
        leftover += _ours()
    return {"trials": n, "rmtree_failed": failed, "came_back": back, "threads_after": len(leftover),
            "thread_names": sorted(set(leftover))}


_CHILD = textwrap.dedent("""
    import sys, threading, atexit, torch, deltackpt
    model = torch.nn.Linear(64, 64)
    for s in range(4):
        with torch.no_grad():
            model.weight.add_(0.01)
        deltackpt.save(model, sys.argv[1], step=s)
    print("THREADS", sorted(t.name for t in threading.enumerate() if t.name.startswith("deltackpt")), flush=True)
""")


def _script_that_ends(work: str) -> dict:
    folder = os.path.join(work, "child")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", _CHILD, folder], capture_output=True, text=True, env=env, timeout=300)
    line = next((x for x in p.stdout.splitlines() if x.startswith("THREADS")), "THREADS ?")
    shutil.rmtree(folder)
    time.sleep(0.2)
    return {"rc": p.returncode, "threads_at_end": line[len("THREADS "):], "came_back": os.path.exists(folder)}


def _memory(job_name: str, quick: bool, work: str, budget: int | None) -> dict:
    """Resident memory above the live state after saves of a real job through one Repo (with
    ``delta_cache_bytes=budget``, None: the default), and what its later saves cost: CPU seconds
    and bytes read (``rchar``: the delta bases read back where the handle kept none)."""
    import time as _time

    import deltackpt
    from bench.common.jobs import make_job
    job = make_job(job_name, tiny=quick)
    for _ in range(2):
        job.step()
    state_bytes = job.state_bytes()
    out: dict = {"job": job_name, "state_mib": state_bytes / 2**20, "delta_cache_bytes": budget}
    tag = f"{job_name}-{budget}"

    # the job's own steps move resident memory too (autograd's and the allocators' caches): each
    # step between measurements is measured alone and taken out, so the figures are the handle's
    drift = drift_live = 0

    def train_step() -> None:
        nonlocal drift, drift_live
        r0, l0 = settled_rss(), malloc_in_use() or 0
        job.step()
        drift += settled_rss() - r0
        drift_live += (malloc_in_use() or 0) - l0

    def above(base: int) -> float:
        return (settled_rss() - base - drift) / state_bytes

    def live(base: int | None) -> float | None:
        # of what is resident, the part live allocations hold (the rest the allocator keeps)
        now = malloc_in_use()
        return None if now is None or base is None else (now - base - drift_live) / state_bytes

    base = settled_rss()   # the live state, the model and optimizer, the interpreter
    base_live = malloc_in_use()
    cpu, read = [], []
    with deltackpt.Repo(os.path.join(work, f"m1-{tag}"), create=True,
                        **({} if budget is None else {"delta_cache_bytes": budget})) as repo:
        repo.save(job.state(), step=0)
        out["after_first_blocking_save"] = above(base)
        for step in range(1, 4):
            train_step()
            c0, r0 = _time.process_time(), proc_io("rchar")
            repo.save(job.state(), step=step)
            cpu.append(_time.process_time() - c0)
            read.append(proc_io("rchar") - r0)
        out["after_blocking_save"] = above(base)
        out["live_after_blocking_save"] = live(base_live)
        out["held_by_delta_cache"] = repo.session.delta_cache.used_bytes / state_bytes
        train_step()
        h = repo.save(job.state(), step=4, blocking=False)
        h.wait()
        out["after_background_save_waited"] = above(base)
        out["threads_while_open"] = _ours()
    out["later_save_cpu_s"] = sorted(cpu)[len(cpu) // 2]
    out["later_save_read"] = sorted(read)[len(read) // 2] / state_bytes
    out["after_close"] = above(base)
    out["live_after_close"] = live(base_live)
    out["threads_after_close"] = _ours()
    a = deltackpt.Repo(os.path.join(work, f"m2-{tag}"), create=True)
    b = deltackpt.Repo(os.path.join(work, f"m3-{tag}"), create=True)
    try:
        for step in range(2):
            train_step()
            a.save(job.state(), step=step)
            b.save(job.state(), step=step)
        out["two_repos_open"] = above(base)
    finally:
        a.close()
        b.close()
    out["after_both_closed"] = above(base)
    out["threads_after_both_closed"] = _ours()
    del job
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def run(args: argparse.Namespace) -> int:
    trials = args.trials or (10 if args.quick else 100)
    jobs = ["minilm-full"] if args.quick else args.jobs.split(",")
    with scratch("deltackpt-bench-hygiene-", parent=args.tmp) as work:
        res = {"rmtree": _rmtree_trials(trials, work), "script_that_ends": _script_that_ends(work),
               "memory": [_memory(j, args.quick, work, budget) for j in jobs for budget in (None, 0)]}
    print(json.dumps(res, indent=1))
    r = res["rmtree"]
    print(f"\nrmtree right after 4 module-level saves: {r['trials'] - r['rmtree_failed'] - r['came_back']}/{r['trials']} "
          f"clean (failed {r['rmtree_failed']}, came back {r['came_back']}); deltackpt threads after: {r['threads_after']}")
    print(f"a script that ends: threads at its end {res['script_that_ends']['threads_at_end']}, rc {res['script_that_ends']['rc']}")
    print("\n| job (state) | delta_cache_bytes | resident above the live state after a blocking save "
          "| of it, live allocations | of it, the delta cache | after a background save's wait | after close "
          "| of it, live allocations | two repositories open | both closed | later save: CPU s, read (x state) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in res["memory"]:
        print(f"| {m['job']} ({m['state_mib']:.0f} MiB) | {'default' if m['delta_cache_bytes'] is None else m['delta_cache_bytes']} "
              f"| {m['after_blocking_save']:.3f} | {_fmt(m['live_after_blocking_save'])} | {m['held_by_delta_cache']:.3f} "
              f"| {m['after_background_save_waited']:.3f} | {m['after_close']:.3f} | {_fmt(m['live_after_close'])} "
              f"| {m['two_repos_open']:.3f} | {m['after_both_closed']:.3f} "
              f"| {m['later_save_cpu_s']:.2f}, {m['later_save_read']:.3f} |")
    ok = (r["rmtree_failed"] == 0 and r["came_back"] == 0 and r["threads_after"] == 0
          and not res["script_that_ends"]["came_back"] and res["script_that_ends"]["threads_at_end"] == "[]"
          and not any(m["threads_after_close"] or m["threads_after_both_closed"] for m in res["memory"]))
    if args.record and not args.quick:
        record("handle_hygiene", args.record, res)
    return 0 if ok else 1
