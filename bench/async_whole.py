"""``bench/async_stall.py`` without ``--paired``: whole runs of ``--steps`` steps per mode, the
faster of ``--repeats`` kept, including the modes only whole runs have (``deltackpt-fork``: a forked
child saves the snapshot; ``deltackpt-thread-nice10``: the save thread at nice +10)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import time

import deltackpt
from deltackpt.snapshot import async_save, staging
from deltackpt.api import Repo

from bench.stall_jobs import Burner, Job, torch_save


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


def whole_runs(job: Job, args: argparse.Namespace, every: int, modes: list[str], workdir: str) -> list[dict]:
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
