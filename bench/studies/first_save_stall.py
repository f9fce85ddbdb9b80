"""Stall of the first background saves of a process, against a durable torch.save of the same state.

A state of a few large tensors (default eight 2048x4096 float32, 268 MB), or with ``--state
recsys|minilm-full|minilm-frozen|gpt2`` that job of bench/common/jobs.py, one real training step
between saves.  Each configuration runs in a fresh Python process (so its first save really is the
process's first), which measures torch.save+fsync of the state (median of 3), then ``--saves``
background saves of the state (a few elements changed, or one training step, between saves), each
waited for before the next, and reports every save's stall (the wall time of the call) and its
ratio to torch.save+fsync:

* ``plain``: ``repo.save(state, blocking=False)`` from the first save on;
* ``prepare``: ``Checkpointer.prepare(state)`` first (its pre-fault waited for, as a loop would
  have trained meanwhile), then the same saves through the Checkpointer.

    python -m bench first_save_stall                      # ~1 minute
    python -m bench first_save_stall --tensors 8 --rows 2048 --cols 4096 --saves 5 --json out.json
    python -m bench first_save_stall --state recsys --record first_save_i18_recsys_1   # into results/first_save_stall.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench.common import record
from bench.common.scratch import scratch

SUMMARY = "stall of a process's first background saves (plain, and after Checkpointer.prepare) against torch.save+fsync"
WRITES = "stdout; --json FILE; --record KEY: bench/results/first_save_stall.json"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--state", default="large", choices=("large", "recsys", "minilm-full", "minilm-frozen", "gpt2"))
    ap.add_argument("--tensors", type=int, default=None, help="large: tensors (default 8, quick 2)")
    ap.add_argument("--rows", type=int, default=None, help="large: rows (default 2048, quick 256)")
    ap.add_argument("--cols", type=int, default=None, help="large: columns (default 4096, quick 512)")
    ap.add_argument("--saves", type=int, default=None, help="background saves per configuration (default 5, quick 2)")
    ap.add_argument("--configs", default="plain,prepare")
    ap.add_argument("--dir", default=None, help="working directory, kept (default: a scratch folder, removed)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--record", default=None, metavar="KEY",
                    help="store the figures as run KEY of bench/results/first_save_stall.json")


def _state(kind: str, tensors: int, rows: int, cols: int, tiny: bool):
    """(state, job): the job's state after 3 steps, or ``tensors`` random rows x cols."""
    import torch
    if kind != "large":
        from bench.common.jobs import make_job
        job = make_job(kind, tiny=tiny)
        for _ in range(3):   # the optimizer state exists, as in a loop's first save
            job.step()
        return job.state(), job
    g = torch.Generator().manual_seed(0)
    return {f"w{i}": torch.randn(rows, cols, generator=g) for i in range(tensors)}, None


def _torch_save_fsync_s(state, path: str) -> float:
    import torch
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _saves(cfg: str, state, job, saves: int, repo: str) -> tuple[list[float], list[float], bool]:
    """(stalls, staging seconds, whether the last version restores bit-identically) of ``saves``
    background saves, each waited for before the next."""
    import torch

    import deltackpt
    from bench.common.measure import digests
    from deltackpt.training import Checkpointer
    ckpt = Checkpointer(repo, policy=1) if cfg == "prepare" else None
    r = deltackpt.Repo(repo, create=True) if ckpt is None else None
    stalls, staging_s = [], []
    try:
        if ckpt is not None:
            pre = ckpt.prepare(state)   # a thread of the Checkpointer's handle, waited for here
            if pre is not None:
                pre.join()
        for step in range(1, saves + 1):
            if job is not None:
                job.step()
            else:
                with torch.no_grad():
                    for t in state.values():
                        t.view(-1)[step * 7919 % t.numel()] += 1.0
            # the stall is the whole call, as the loop sees it (stall_seconds counts the staging only)
            t0 = time.perf_counter()
            h = ckpt.step(state, step=step) if ckpt is not None else r.save(state, step=step, blocking=False)
            stalls.append(time.perf_counter() - t0)
            staging_s.append(h.stall_seconds)
            h.wait()
        expected = digests(state)
    finally:
        if ckpt is not None:
            ckpt.close()
        if r is not None:
            r.close()
    check = deltackpt.Repo(repo)
    try:
        ok = digests(check.load("latest")) == expected
    finally:
        check.close()
    return stalls, staging_s, ok


def _copy_floors(live: list) -> tuple[float, float]:
    """Seconds to copy the state's tensors (torch's parallel copy, every core) into fresh memory, as
    a first save must, and into memory already faulted in, as later saves can (medians of 3)."""
    import torch
    fresh, warm = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        dst = [torch.empty_like(t) for t in live]
        for d, t in zip(dst, live):
            d.copy_(t)
        fresh.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for d, t in zip(dst, live):
            d.copy_(t)
        warm.append(time.perf_counter() - t0)
        del dst
    return statistics.median(fresh), statistics.median(warm)


def _child(cfg: str, kind: str, tensors: int, rows: int, cols: int, saves: int, workdir: str, tiny: bool) -> dict:
    import torch

    from bench.common.measure import tensor_bytes
    from bench.common.systems import split
    state, job = _state(kind, tensors, rows, cols, tiny)
    nbytes = tensor_bytes(state)
    torch_save_s = _torch_save_fsync_s(state, os.path.join(workdir, "torch.pt"))
    stalls, staging_s, ok = _saves(cfg, state, job, saves, os.path.join(workdir, f"repo-{cfg}"))
    # the floors after the saves, not to lend them warm heap memory
    fresh, warm = _copy_floors(list(split(state)[0].values()))
    return {"config": cfg, "state": kind, "state_bytes": nbytes, "torch_threads": torch.get_num_threads(),
            "torch_save_fsync_s": torch_save_s, "copy_fresh_s": fresh,
            "copy_faulted_s": warm, "stalls_s": stalls, "staging_s": staging_s,
            "ratios": [s / torch_save_s for s in stalls], "restored_bit_identical": ok}


def _print_table(results: list[dict], state: str, saves: int) -> None:
    print(f"state {state}, {results[0]['state_bytes'] / 1e6:.0f} MB, {os.cpu_count()} cores")
    print("| config | torch.save+fsync | copy into fresh / faulted memory | "
          + " | ".join(f"save {i + 1}" for i in range(saves)) + " |")
    print("|---|---|---|" + "---|" * saves)
    for r in results:
        cells = " | ".join(f"{s * 1e3:.0f} ms ({x:.2f}x)" for s, x in zip(r["stalls_s"], r["ratios"]))
        ts = r["torch_save_fsync_s"]
        print(f"| {r['config']} | {ts * 1e3:.0f} ms | {r['copy_fresh_s'] * 1e3:.0f} ms ({r['copy_fresh_s'] / ts:.2f}x) / "
              f"{r['copy_faulted_s'] * 1e3:.0f} ms ({r['copy_faulted_s'] / ts:.2f}x) | {cells} |")


def run(args: argparse.Namespace) -> int:
    q = args.quick
    tensors, rows, cols = args.tensors or (2 if q else 8), args.rows or (256 if q else 2048), args.cols or (512 if q else 4096)
    saves = args.saves or (2 if q else 5)
    results = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    with scratch("deltackpt-bench-first-save-", keep=args.dir, parent=args.tmp) as workdir:
        for cfg in args.configs.split(","):
            # a child per configuration: its first save is the process's first; its files go under
            # this folder, which goes however the child ends
            out = subprocess.run([sys.executable, "-m", "bench.studies.first_save_stall", cfg, args.state, str(tensors),
                                  str(rows), str(cols), str(saves), workdir, "tiny" if q else "full"],
                                 check=True, capture_output=True, text=True, env=env)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    _print_table(results, args.state, saves)
    bad = [r["config"] for r in results if not r["restored_bit_identical"]]
    if bad:
        print(f"NOT BIT-IDENTICAL: {bad}", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.record:
        print(f"recorded as {args.record} in {record.record('first_save_stall', args.record, results)}")
    return 0


if __name__ == "__main__":   # the child: python -m bench.studies.first_save_stall CFG STATE TENSORS ROWS COLS SAVES DIR SIZE
    c = sys.argv[1:]
    print(json.dumps(_child(c[0], c[1], int(c[2]), int(c[3]), int(c[4]), int(c[5]), c[6], c[7] == "tiny")))
