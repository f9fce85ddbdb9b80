"""``python -m bench training_slowdown --paired ROUNDS``: the systems take turns cycle by cycle and
each cycle is compared with the ``none`` cycle of its own round, with a bootstrap interval of the
median and an in-cycle overlap estimate checked by a placebo on the ``none`` cycles (see ASYNC.md,
stops 12-14).  Finer than whole runs where whole runs differ by 5% from one to the next."""

from __future__ import annotations

import os
import random
import statistics
import time

from bench.common.jobs import Job
from bench.studies import training_slowdown_savers as savers


def runq() -> float:
    """Seconds the calling thread has waited on a run queue (Linux schedstat; 0 elsewhere): the part
    of a slowdown that is the loop being ready to run with no core for it."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def median_ci(values: list[float], level: float = 0.90, resamples: int = 2000) -> list[float]:
    """Percentile-bootstrap interval of the median (seeded): how far this run's median could be
    from the machine's, given the cycle-to-cycle spread."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    return [lo, meds[min(resamples - 1, int((1 + level) / 2 * resamples))]]


def overlap_estimate(durations: list[float], busy: list[bool], stall: float) -> float:
    """(stall + extra time of the busy steps over the cycle's clean pace) / the cycle at that pace."""
    base = statistics.median(d for d, b in zip(durations, busy) if not b)
    return (stall + sum(d - base for d, b in zip(durations, busy) if b)) / (len(durations) * base)


class _Cycles:
    """What the cycles of one rotation measured, per mode."""

    def __init__(self, modes: list[str]) -> None:
        self.times: dict[str, list[float]] = {m: [] for m in modes}
        self.cpu: dict[str, list[float]] = {m: [] for m in modes}     # the loop thread's own CPU time per cycle
        self.runq: dict[str, list[float]] = {m: [] for m in modes}    # the loop thread's run-queue wait per cycle
        self.stalls: dict[str, list[float]] = {m: [] for m in modes}
        self.background: dict[str, list[float]] = {}
        self.local: dict[str, list[float]] = {m: [] for m in modes}
        self.none_steps: list[list[float]] = []      # the none cycles' step times, for the placebo
        self.busy_steps: dict[str, list[int]] = {m: [] for m in modes}


def _cycle(m: _Cycles, mode: str, job: Job, every: int, warm: bool, saver: savers.Saver, step: int) -> None:
    """One cycle: ``mode``'s save, ``every`` steps, then the wait for its background work (a later
    save would wait for it: that wait is loop time).  ``warm``: round 0, measured but not kept."""
    t0, c0, q0 = time.perf_counter(), time.thread_time(), runq()
    waited0 = saver.step_wait()
    saver.save(job, step)
    m.stalls[mode].append(time.perf_counter() - t0)
    steps: list[tuple[float, bool]] = []   # (seconds, ran while the background save did)
    for _ in range(every):
        busy = saver.busy()
        s0 = time.perf_counter()
        job.step()
        steps.append((time.perf_counter() - s0, busy))
    background = saver.wait()
    # a lazy save's stall also counts the step that waited for its copy
    m.stalls[mode][-1] += saver.step_wait() - waited0
    clean = [d for d, busy in steps if not busy]
    if not warm and mode == "none":
        m.none_steps.append([d for d, _ in steps])
    if not warm:
        m.busy_steps[mode].append(sum(busy for _, busy in steps))
    if not warm and len(clean) >= 3:
        # the cycle's own clean steps are the baseline: drift from elsewhere cancels
        m.local[mode].append(overlap_estimate([d for d, _ in steps], [b for _, b in steps], m.stalls[mode][-1]))
    if not warm and background is not None:
        m.background.setdefault(mode, []).append(background)
    if not warm:
        m.times[mode].append(time.perf_counter() - t0)
        m.cpu[mode].append(time.thread_time() - c0)
        m.runq[mode].append(runq() - q0)


def _summary(m: _Cycles, mode: str) -> dict:
    ratios = [t / n - 1 for t, n in zip(m.times[mode], m.times["none"])]
    local = m.local[mode]
    return {"slowdown_median": statistics.median(ratios), "slowdown_mean": statistics.mean(ratios),
            "slowdown_median_ci90": median_ci(ratios),
            "slowdown_total": sum(m.times[mode]) / sum(m.times["none"]) - 1, "cycle_s": m.times[mode],
            # > 0: the loop's own instructions ran slower (caches, memory bandwidth); the
            # rest of the slowdown is waiting (GIL, run queue, the save's stall)
            "loop_cpu_slowdown_median": statistics.median(a / b - 1 for a, b in zip(m.cpu[mode], m.cpu["none"])),
            "loop_runq_median_s": statistics.median(m.runq[mode]),
            "stall_median_s": statistics.median(m.stalls[mode][1:]),
            # (stall + extra time of the steps that overlapped the background work) / the
            # cycle at its clean steps' pace; misses effects that outlast the save (torch.save's
            # writeback), so it flatters torch.save, not deltackpt
            "slowdown_overlap_median": statistics.median(local) if local else None,
            "slowdown_overlap_mean": statistics.mean(local) if local else None}


def run_paired(job: Job, every: int, modes: list[str], cycles: int, workdir: str, burn_s: float) -> dict:
    """Cycles of ``every`` steps, the modes taking turns cycle by cycle; a cycle starts with its
    mode's save and ends when its steps are done AND its background work has finished (a later
    save would wait for it: that wait is loop time).  Load from elsewhere drifts slowly, so a mode's
    cycle is compared with the ``none`` cycle next to it: slowdown = median over rounds of
    (cycle time / none cycle time of the same round) - 1.  Robust where whole runs differ by 5%."""
    m = _Cycles(modes)
    made = {mode: savers.make(mode, os.path.join(workdir, mode), burn_s) for mode in modes}
    step = 0
    # torch.save leaves its file's pages dirty; their writeback (kernel threads on the other core,
    # seconds later) would land in whichever cycle comes next.  Flush before starting, and run
    # torch.save in a rotation of its own ("none,torch.save") to keep it out of the others'.
    os.sync()
    try:
        for c in range(cycles + 1):              # round 0 warms up (first save writes everything)
            order = modes[c % len(modes):] + modes[:c % len(modes)]   # rotate: no mode always follows another
            for mode in order:
                _cycle(m, mode, job, every, c == 0, made[mode], step)
                step += every
    finally:   # nothing may go on writing into the work folder
        for saver in made.values():
            saver.close()
    out = {mode: _summary(m, mode) for mode in modes}
    for mode, seconds in m.background.items():
        out[mode]["background_median_s"] = statistics.median(seconds)
    for mode in modes:
        k = round(statistics.median(m.busy_steps[mode])) if m.busy_steps[mode] else 0
        if out[mode]["slowdown_overlap_median"] is not None and 0 < k <= every - 3 and m.none_steps:
            # the same estimate on the none cycles, taking their first k steps as if busy: what the
            # first steps of any cycle cost with no save at all (the estimate's own bias)
            placebo = [overlap_estimate(st, [i < k for i in range(every)], 0.0) for st in m.none_steps]
            out[mode]["slowdown_overlap_placebo_median"] = statistics.median(placebo)
            out[mode]["busy_steps_median"] = k
    return out


def run_rotations(job: Job, every: int, spec: str, rounds: int, workdir: str, burn_s: float) -> dict:
    """``spec`` "a,b;c,d": separate rotations (each with its own none cycles), results merged;
    slowdowns are always against the none cycles of the mode's own rotation."""
    res: dict = {}
    for rotation in spec.split(";"):
        rmodes = rotation.split(",")
        if "none" not in rmodes:
            rmodes = ["none"] + rmodes
        for mode, r in run_paired(job, every, rmodes, rounds, workdir, burn_s).items():
            res.setdefault(mode, r)
    return res


def print_table(res: dict) -> None:
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
