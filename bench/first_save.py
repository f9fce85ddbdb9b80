"""Stall of the first background saves of a process, against a durable torch.save of the same state.

Issue 18's case: a state of a few large tensors (default eight 2048x4096 float32, 268 MB), or
with ``--state recsys|minilm-full|minilm-frozen`` that job of bench/stall_jobs.py (recsys:
EmbeddingBag(400_000, 64) + SparseAdam + an MLP head with Adam, ~308 MB), one real training step
between saves.  Each
configuration runs in a fresh Python process (so its first save really is the process's first),
which measures torch.save+fsync of the state (median of 3), then ``--saves`` background saves of
the state (a few elements changed, or one training step, between saves), each waited for before
the next, and reports every save's stall (the wall time of the call) and its ratio to
torch.save+fsync:

* ``plain``: ``deltackpt.save(state, repo, blocking=False)`` from the first save on;
* ``prepare``: ``Checkpointer.prepare(state)`` first (its pre-fault waited for, as a loop would
  have trained meanwhile), then the same saves through the Checkpointer.

    PYTHONPATH=. python bench/first_save.py                      # ~1 minute
    PYTHONPATH=. python bench/first_save.py --tensors 8 --rows 2048 --cols 4096 --saves 5 --json out.json
    PYTHONPATH=. python bench/first_save.py --state recsys --record first_save_i18_recsys_1   # into bench/results/async.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import record  # noqa: E402
from bench.scratch import scratch  # noqa: E402


def _state(kind: str, tensors: int, rows: int, cols: int):
    """(state, job): the stall_jobs job's state after 3 steps, or ``tensors`` random rows x cols."""
    import torch
    if kind != "large":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from bench.stall_jobs import make_job
        job = make_job(kind)
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


def _saves(cfg: str, state, job, saves: int, repo: str) -> tuple[list[float], list[float]]:
    """(stalls, staging seconds) of ``saves`` background saves, each waited for before the next."""
    import torch

    import deltackpt
    from deltackpt.training import Checkpointer
    ckpt = Checkpointer(repo, policy=1) if cfg == "prepare" else None
    if ckpt is not None:
        ckpt.prepare(state).result()
    stalls, staging_s = [], []
    for step in range(1, saves + 1):
        if job is not None:
            job.step()
        else:
            with torch.no_grad():
                for t in state.values():
                    t.view(-1)[step * 7919 % t.numel()] += 1.0
        # the stall is the whole call, as the loop sees it (stall_seconds counts the staging only)
        t0 = time.perf_counter()
        h = ckpt.step(state, step=step) if ckpt is not None else deltackpt.save(state, repo, step=step, blocking=False)
        stalls.append(time.perf_counter() - t0)
        staging_s.append(h.stall_seconds)
        h.wait()
    return stalls, staging_s


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


def _child(cfg: str, kind: str, tensors: int, rows: int, cols: int, saves: int, workdir: str) -> dict:
    import torch

    from deltackpt.torchstate.flatten import flatten
    state, job = _state(kind, tensors, rows, cols)
    nbytes = sum(leaf.tensor.numel() * leaf.tensor.element_size() for leaf in flatten(state)[1])
    torch_save_s = _torch_save_fsync_s(state, os.path.join(workdir, "torch.pt"))
    stalls, staging_s = _saves(cfg, state, job, saves, os.path.join(workdir, f"repo-{cfg}"))
    # the floors after the saves, not to lend them warm heap memory
    fresh, warm = _copy_floors([leaf.tensor for leaf in flatten(state)[1]])
    return {"config": cfg, "state": kind, "state_bytes": nbytes, "torch_threads": torch.get_num_threads(),
            "torch_save_fsync_s": torch_save_s, "copy_fresh_s": fresh,
            "copy_faulted_s": warm, "stalls_s": stalls, "staging_s": staging_s,
            "ratios": [s / torch_save_s for s in stalls]}


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", default="large", choices=("large", "recsys", "minilm-full", "minilm-frozen"))
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--configs", default="plain,prepare")
    ap.add_argument("--dir", default=None, help="working directory, kept (default: a temp dir, removed)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--record", default=None, metavar="KEY",
                    help="store the figures as run KEY of bench/results/async.json (the data behind ASYNC.md)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:   # its files go under the parent's folder: the parent removes them, even after a SIGKILL
        print(json.dumps(_child(args.child, args.state, args.tensors, args.rows, args.cols, args.saves, args.dir)))
        return 0
    results = []
    with scratch("first-save-", keep=args.dir) as workdir:
        for cfg in args.configs.split(","):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", cfg, "--state", args.state,
                                  "--tensors", str(args.tensors),
                                  "--rows", str(args.rows), "--cols", str(args.cols), "--saves", str(args.saves),
                                  "--dir", workdir], check=True, capture_output=True, text=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    _print_table(results, args.state, args.saves)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.record:
        print(f"recorded as {args.record} in {record.record('async', args.record, results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
