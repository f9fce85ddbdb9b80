"""Fault-tolerance overhead of checkpoint policies over simulated failure traces.

A job needs ``--hours`` of useful training in steps of ``--step-s`` seconds.  Failures arrive
with exponential inter-failure times (mean ``--mtbf-h``, seeded, ``--traces`` traces).  After a
failure the job pays ``--restore-s`` (restart + load) and continues from the last *committed*
checkpoint.  Overhead = stalls (time the loop is blocked by saves, waits included) + lost work
(progress since the last committed checkpoint) + restore time, as a fraction of the useful time.

Checkpoint costs: a blocking ``torch.save`` stalls for ``--torch-save-s`` and is committed when it
returns.  A deltackpt background save stalls for ``--stall-ratio`` x that (the snapshot) plus
``--contention-ratio`` x that (what the background work costs the loop), and is committed
``--background-ratio`` x later; a failure in between loses it.  The ratios default to what
bench/async_stall.py measured on the project machine (``--from-bench FILE`` reads its JSON).

The policies are deltackpt's own objects (deltackpt/frontend/policies.py) driven by simulated time.

    PYTHONPATH=. python bench/policy_sim.py                      # table + bench/POLICIES.md
    PYTHONPATH=. python bench/policy_sim.py --mtbf-h 1 --torch-save-s 120
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import random
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deltackpt.frontend.policies import DenseEarly, EveryN, EveryT, OnImprovement, Policy, YoungDaly, AnyOf  # noqa: E402


@dataclass
class Costs:
    stall: float        # loop seconds blocked per save (snapshot or whole save)
    background: float   # seconds from the snapshot to the commit (0: committed when the stall ends)


@dataclass
class Result:
    stall: float = 0.0
    lost: float = 0.0
    restore: float = 0.0
    saves: int = 0
    failures: int = 0

    @property
    def total(self) -> float:
        return self.stall + self.lost + self.restore


def val_loss(step: int, rnd: random.Random) -> float:
    """A noisy decreasing curve, evaluated every 100 steps (for OnImprovement)."""
    return 2.0 / math.sqrt(1 + step / 500) + rnd.gauss(0, 0.01)


def simulate(make_policy, costs: Costs, steps: int, step_s: float, restore_s: float,
             failures: list[float], seed: int) -> Result:
    res = Result()
    rnd = random.Random(seed)
    policy: Policy = make_policy()
    t, step, committed = 0.0, 0, 0
    pending: tuple[int, float] | None = None       # (step, commit time) of a save in flight
    fails = iter(failures)
    next_fail = next(fails, math.inf)
    while step < steps:
        if pending and pending[1] <= t:
            committed, pending = pending[0], None
        if t + step_s > next_fail:               # dies during this step (or during the last stall)
            if pending and pending[1] <= next_fail:
                committed = pending[0]
            res.lost += (step - committed) * step_s + max(0.0, next_fail - t)
            res.restore += restore_s
            res.failures += 1
            t = max(t, next_fail) + restore_s
            step, pending = committed, None
            policy = make_policy()               # a new process: fresh policy objects
            policy.resumed(step, t)
            while next_fail <= t:                # failures during the restore restart it
                next_fail = next(fails, math.inf)
                if next_fail <= t:
                    res.restore += restore_s
                    t = next_fail + restore_s
            continue
        t += step_s
        step += 1
        metrics = {"val_loss": val_loss(step, rnd)} if step % 100 == 0 else {}
        if policy.due(step, t, metrics):
            stall = costs.stall
            if pending:                          # at most one save in flight: wait for it
                stall += max(0.0, pending[1] - t)
                committed, pending = pending[0], None
            t += stall
            res.stall += stall
            res.saves += 1
            if costs.background > 0:
                pending = (step, t + costs.background)
            else:
                committed = step
            policy.saved(step, t, stall, metrics)
    return res


def run_policies(args, dk_costs: Costs, torch_costs: Costs, mtbf: float, steps: int, n_torch: int) -> list[tuple]:
    C = args.torch_save_s
    min_gap = dk_costs.background   # no point saving faster than a save commits
    policies = [
        ("torch.save, fixed interval (Young/Daly-optimal for its cost)", torch_costs, lambda: EveryN(n_torch)),
        ("torch.save, every 30 min", torch_costs, lambda: EveryT(1800)),
        ("deltackpt async, same fixed interval", dk_costs, lambda: EveryN(n_torch)),
        ("deltackpt async, every 30 min", dk_costs, lambda: EveryT(1800)),
        ("deltackpt async, Young/Daly (measured cost)", dk_costs,
         lambda: YoungDaly(mtbf, initial_cost=C, min_interval=min_gap)),
        ("deltackpt async, dense early (COCI-like)", dk_costs,
         lambda: DenseEarly(first=max(1, n_torch // 16), growth=1.3, max_every=max(1, n_torch // 2))),
        ("deltackpt async, Young/Daly or val_loss improvement", dk_costs,
         lambda: AnyOf(YoungDaly(mtbf, initial_cost=C, min_interval=min_gap),
                       OnImprovement("val_loss", min_delta=0.01))),
    ]
    table = []
    for name, costs, make in policies:
        agg = Result()
        for k in range(args.traces):
            fails = trace(args.seed + k, mtbf, steps * args.step_s * 3)
            r = simulate(make, costs, steps, args.step_s, args.restore_s, fails, args.seed + k)
            for f in ("stall", "lost", "restore", "saves", "failures"):
                setattr(agg, f, getattr(agg, f) + getattr(r, f))
        n = args.traces
        table.append((name, agg.stall / n, agg.lost / n, agg.restore / n, agg.total / n, agg.saves / n,
                      agg.failures / n))
    return table


def trace(seed: int, mtbf_s: float, horizon_s: float) -> list[float]:
    rnd = random.Random(seed)
    out, t = [], 0.0
    while t < horizon_s:
        t += rnd.expovariate(1.0 / mtbf_s)
        out.append(t)
    return out


def bench_ratios(b: dict, thread_mode: str) -> tuple[float, float, float]:
    """(stall, contention, background) / torch.save stall from bench/async_stall.py's JSON."""
    if "paired" in b:   # --paired: the loop cost per save beyond the stall, from paired cycles
        p = b["paired"]
        ref, th = p["torch.save"]["stall_median_s"], p[thread_mode]
        # the overlap estimate when the run has it: the larger and steadier of the two here
        slowdown = max(th["slowdown_median"], th.get("slowdown_overlap_median") or 0.0)
        loop_cost = slowdown * statistics.median(p["none"]["cycle_s"])
        return (th["stall_median_s"] / ref, max(0.0, loop_cost - th["stall_median_s"]) / ref,
                (th.get("background_median_s") or 0.0) / ref)
    rows = {r["mode"]: r for r in b["rows"]}
    th = rows[thread_mode]
    ref = rows["torch.save"]["stall_all_median_s"]
    # whole runs, interleaved (repeat k of every mode ran back to back): pair them, take the median
    paired = sorted(t["step_mean_s"] - n["step_mean_s"] for t, n in zip(th["runs"], rows["none"]["runs"]))
    return (th["stall_all_median_s"] / ref, max(0.0, paired[len(paired) // 2]) * b["every"] / ref,
            (th["background_median_s"] or 0.0) / ref)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0, help="useful training time")
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--mtbf-h", type=float, default=4.0)
    ap.add_argument("--restore-s", type=float, default=120.0)
    ap.add_argument("--torch-save-s", type=float, default=60.0, help="blocking torch.save of the state")
    ap.add_argument("--stall-ratio", type=float, default=0.05, help="deltackpt snapshot stall / torch.save")
    ap.add_argument("--contention-ratio", type=float, default=0.05,
                    help="loop time the background save costs (GIL, cores) / torch.save")
    ap.add_argument("--background-ratio", type=float, default=3.0, help="snapshot-to-commit time / torch.save")
    ap.add_argument("--from-bench", help="bench/async_stall.py --json output: take the ratios from it")
    ap.add_argument("--thread-mode", default="deltackpt-thread", help="which bench row is deltackpt's default")
    ap.add_argument("--traces", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "POLICIES.md"))
    args = ap.parse_args(argv)

    source = "defaults"
    if args.from_bench:
        with open(args.from_bench) as f:
            args.stall_ratio, args.contention_ratio, args.background_ratio = bench_ratios(json.load(f), args.thread_mode)
        source = args.from_bench
    mtbf = args.mtbf_h * 3600
    steps = int(args.hours * 3600 / args.step_s)
    useful = steps * args.step_s
    C = args.torch_save_s
    yd_torch = math.sqrt(2 * C * mtbf)                      # Young/Daly optimum for torch.save
    n_torch = max(1, round(yd_torch / args.step_s))
    lines = [
        "# Checkpoint policies: simulated fault-tolerance overhead",
        "",
        f"Generated by `PYTHONPATH=. python bench/policy_sim.py{' --from-bench ' + source if args.from_bench else ''}"
        f"{' --thread-mode ' + args.thread_mode if args.thread_mode != 'deltackpt-thread' else ''}`"
        f" ({args.traces} seeded failure traces, seed {args.seed}).",
        "",
        f"Job: {args.hours:g} h of useful training, {args.step_s:g} s steps; failures exponential with MTBF "
        f"{args.mtbf_h:g} h; restore (restart + load) {args.restore_s:g} s.  torch.save stalls {C:g} s and is "
        f"committed when it returns.  Young/Daly interval for torch.save: sqrt(2 x {C:g} x {mtbf:g}) = "
        f"{yd_torch:.0f} s ({n_torch} steps).  Overhead = stalls + lost work + restore, hours per job.",
    ]
    scenarios = [
        ("measured on the project machine (2 shared cores: the background save competes with training)",
         args.contention_ratio),
        ("spare cores (a GPU node: the background save does not slow the loop; stall = snapshot only)", 0.0),
    ]
    for title, contention in scenarios:
        dk_costs = Costs(C * (args.stall_ratio + contention), C * args.background_ratio)
        table = run_policies(args, dk_costs, Costs(C, 0.0), mtbf, steps, n_torch)
        base = table[0][4]
        lines += [
            "",
            f"## Scenario: {title}",
            "",
            f"deltackpt background save: loop cost {dk_costs.stall:.3g} s per save (snapshot {args.stall_ratio:.3f}x + "
            f"contention {contention:.3f}x of torch.save; ratios from {source}), committed {dk_costs.background:.3g} s "
            "after the snapshot (a failure before that loses it).",
            "",
            "| policy | stalls h | lost work h | restore h | total h | total % of useful | vs baseline | saves | failures |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, st, lo, re, tot, sv, fl in table:
            lines.append(f"| {name} | {st / 3600:.2f} | {lo / 3600:.2f} | {re / 3600:.2f} | {tot / 3600:.2f} | "
                         f"{tot / useful:.1%} | {tot / base:.2f}x | {sv:.0f} | {fl:.1f} |")
        best = min(table, key=lambda r: r[4])
        lines += ["", f"Lowest overhead: {best[0]} ({best[4] / base:.2f}x the baseline)."]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
