"""Fault-tolerance overhead of checkpoint policies over simulated failure traces.

A job needs ``--hours`` of useful training in steps of ``--step-s`` seconds.  Failures arrive
with exponential inter-failure times (mean ``--mtbf-h``, seeded, ``--traces`` traces).  After a
failure the job pays its restore time and continues from the last *committed* checkpoint.
Overhead = stalls (time the loop is blocked by saves, waits included) + lost work (progress since
the last committed checkpoint) + restore time, as a fraction of the useful time.

Restore time, per system: ``--restart-s`` (the same for both) plus that system's cold load of the
latest version: ``--torch-load-s`` for torch.load, ``--restore-ratio`` x that for deltackpt, the
ratio bench/run.py measures (``--from-results FILE`` reads its JSON, else ``MEASURED_RESTORE``).

Checkpoint costs: a blocking ``torch.save`` stalls for ``--torch-save-s`` and is committed when it
returns.  A deltackpt background save stalls for ``--stall-ratio`` x that (the snapshot) plus
``--contention-ratio`` x that (what the background work costs the loop), and is committed
``--background-ratio`` x later; a failure in between loses it.  ``--from-bench FILE`` reads these
ratios from bench/async_stall.py's JSON (the row ``--thread-mode``, against its torch.save+fsync
row, or torch.save where the run had no fsync row).

The policies are deltackpt's own objects (deltackpt/training/policies.py) driven by simulated time.
    PYTHONPATH=. python bench/policy_sim.py --mtbf-h 1 --torch-save-s 120   # tables + bench/POLICIES.md
    PYTHONPATH=. python bench/policy_sim.py --from-bench bench/results/X.json --from-results bench/results.json
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

from deltackpt.training.policies import DenseEarly, EveryN, EveryT, OnImprovement, Policy, YoungDaly, AnyOf  # noqa: E402


# deltackpt's cold load of the latest version / cold torch.load of it (bench/run.py, format 2, this
# machine's 2 cores, cold page cache, 2026-11-24): decoding on 2 cores is slower than this disk.
MEASURED_RESTORE = {"minilm-full": 1.64, "minilm-frozen": 1.55, "recsys": 0.95, "gpt-bf16": 2.0}


@dataclass
class Costs:
    stall: float        # loop seconds blocked per save (snapshot or whole save)
    background: float   # seconds from the snapshot to the commit (0: committed when the stall ends)
    restore: float      # seconds from a failure to training again (restart + load)


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


def simulate(make_policy, costs: Costs, steps: int, step_s: float, failures: list[float], seed: int) -> Result:
    res = Result()
    restore_s = costs.restore
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


def run_policies(args, dk: Costs, ts: Costs, mtbf: float, steps: int, n_torch: int,
                 plain: Costs | None = None, only: set[str] | None = None) -> list[tuple]:
    """Each policy over every trace: (name, stall, lost, restore, total, saves, failures), means per job."""
    C = args.torch_save_s
    min_gap = dk.background   # no point saving faster than a save commits
    policies = [
        ("torch.save, fixed interval (Young/Daly-optimal for its cost)", ts, lambda: EveryN(n_torch)),
        ("torch.save, every 30 min", ts, lambda: EveryT(1800)),
        ("deltackpt async, same fixed interval", dk, lambda: EveryN(n_torch)),
        ("deltackpt async, every 30 min", dk, lambda: EveryT(1800)),
        ("deltackpt async, Young/Daly (measured cost)", dk,
         lambda: YoungDaly(mtbf, initial_cost=C, min_interval=min_gap)),
        ("deltackpt async, dense early (COCI-like)", dk,
         lambda: DenseEarly(first=max(1, n_torch // 16), growth=1.3, max_every=max(1, n_torch // 2))),
        ("deltackpt async, Young/Daly or val_loss improvement", dk,
         lambda: AnyOf(YoungDaly(mtbf, initial_cost=C, min_interval=min_gap),
                       OnImprovement("val_loss", min_delta=0.01))),
    ]
    if plain is not None:   # the same Young/Daly policy with the plain (non-lazy) background snapshot
        policies.append(("deltackpt async, plain snapshot, Young/Daly (measured cost)", plain,
                         lambda: YoungDaly(mtbf, initial_cost=C, min_interval=plain.background)))
    table = []
    for name, costs, make in policies:
        if only is not None and name not in only:
            continue
        agg = Result()
        for k in range(args.traces):
            fails = trace(args.seed + k, mtbf, steps * args.step_s * 3)
            r = simulate(make, costs, steps, args.step_s, fails, args.seed + k)
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


def bench_ratios(b: dict, thread_mode: str) -> tuple[float, float, float, str]:
    """(stall, contention, background) / torch.save stall from bench/async_stall.py's JSON, and the
    name of the row they are relative to (torch.save+fsync where the run has it: it is durable on
    return, as the simulation's torch.save is)."""
    if "paired" not in b:
        raise SystemExit("--from-bench needs a bench/async_stall.py --paired JSON (whole-run JSONs predate stop 12)")
    p = b["paired"]   # the loop cost per save beyond the stall, from paired cycles
    ref_mode = "torch.save+fsync" if "torch.save+fsync" in p else "torch.save"
    ref, th = p[ref_mode]["stall_median_s"], p[thread_mode]
    # the overlap estimate when the run has it: the larger and steadier of the two here
    slowdown = max(th["slowdown_median"], th.get("slowdown_overlap_median") or 0.0)
    loop_cost = slowdown * statistics.median(p["none"]["cycle_s"])
    return (th["stall_median_s"] / ref, max(0.0, loop_cost - th["stall_median_s"]) / ref,
            (th.get("background_median_s") or 0.0) / ref, ref_mode)


def restore_ratios(results: dict) -> dict[str, float]:
    """Per workload of bench/run.py's JSON: deltackpt's cold load of the latest version / cold
    torch.load of that version (its "load latest" rollback row, else the last cold loads)."""
    out = {}
    for w in results["results"]:
        rows = [x for x in (w.get("rollback") or {}).get("rows", []) if x.get("by") == 0]
        if rows:
            out[w["workload"]] = rows[0]["s"] / rows[0]["ts_cold_s"]
        elif "load_cold" in w["systems"].get("deltackpt", {}):
            out[w["workload"]] = w["systems"]["deltackpt"]["load_cold"][-1] / w["systems"]["torch.save"]["load_cold"][-1]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0, help="useful training time")
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--mtbf-h", type=float, default=4.0)
    ap.add_argument("--restart-s", type=float, default=60.0, help="failure to process ready to load (both systems)")
    ap.add_argument("--torch-load-s", type=float, default=60.0, help="cold torch.load of the state")
    ap.add_argument("--restore-ratio", type=float, default=None,
                    help="deltackpt cold load / cold torch.load (default: --workload's measured ratio)")
    ap.add_argument("--from-results", help="bench/run.py's JSON: take the restore ratios from it")
    ap.add_argument("--workload", default="minilm-full", help="whose restore ratio the main tables use")
    ap.add_argument("--torch-save-s", type=float, default=60.0, help="blocking torch.save of the state")
    ap.add_argument("--stall-ratio", type=float, default=0.05, help="deltackpt snapshot stall / torch.save")
    ap.add_argument("--contention-ratio", type=float, default=0.05,
                    help="loop time the background save costs (GIL, cores) / torch.save")
    ap.add_argument("--background-ratio", type=float, default=3.0, help="snapshot-to-commit time / torch.save")
    ap.add_argument("--from-bench", help="bench/async_stall.py --json output: take the ratios from it")
    ap.add_argument("--thread-mode", default=None,
                    help="which bench row is deltackpt's save (default: deltackpt-lazy if the run has it)")
    ap.add_argument("--traces", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "POLICIES.md"))
    args = ap.parse_args(argv)

    source, ref_mode, plain_ratios, spread = "defaults", "torch.save", None, ""
    if args.from_bench:
        with open(args.from_bench) as f:
            b = json.load(f)
        modes = b.get("paired", {})
        args.thread_mode = args.thread_mode or ("deltackpt-lazy" if "deltackpt-lazy" in modes else "deltackpt-thread")
        args.stall_ratio, args.contention_ratio, args.background_ratio, ref_mode = bench_ratios(b, args.thread_mode)
        if args.thread_mode == "deltackpt-lazy" and "deltackpt-thread" in modes:
            plain_ratios = bench_ratios(b, "deltackpt-thread")[:3]
        source, th = args.from_bench, modes[args.thread_mode]
        if "slowdown_median_ci90" in th:   # how sure the contention input is
            lo, hi = th["slowdown_median_ci90"]
            spread = (f"; that run's slowdown: paired median {th['slowdown_median']:+.1%} [90% CI {lo:+.1%}, {hi:+.1%}], "
                      f"overlap estimate {th['slowdown_overlap_median'] or 0:+.1%}, every {b['every']} steps")
    ratios = dict(MEASURED_RESTORE)
    r_source = "MEASURED_RESTORE in bench/policy_sim.py (bench/run.py, format 2, cold cache, 2026-11-24)"
    if args.from_results:
        with open(args.from_results) as f:
            ratios = restore_ratios(json.load(f))
        r_source = args.from_results
    if args.restore_ratio is not None:
        ratios[args.workload], r_source = args.restore_ratio, "--restore-ratio"
    ratio = ratios[args.workload]
    mtbf = args.mtbf_h * 3600
    steps = int(args.hours * 3600 / args.step_s)
    useful = steps * args.step_s
    C = args.torch_save_s
    yd_torch = math.sqrt(2 * C * mtbf)                      # Young/Daly optimum for torch.save
    n_torch = max(1, round(yd_torch / args.step_s))
    ts = Costs(C, 0.0, args.restart_s + args.torch_load_s)
    dk_restore = args.restart_s + ratio * args.torch_load_s
    cmd = " ".join(["PYTHONPATH=. python bench/policy_sim.py"] + (argv if argv is not None else sys.argv[1:]))
    lines = [
        "# Checkpoint policies: simulated fault-tolerance overhead",
        "",
        f"Generated by `{cmd}` ({args.traces} seeded failure traces, seed {args.seed}).",
        "",
        f"Job: {args.hours:g} h of useful training, {args.step_s:g} s steps; failures exponential with MTBF "
        f"{args.mtbf_h:g} h.  torch.save stalls {C:g} s and is committed when it returns.  Young/Daly interval "
        f"for torch.save: sqrt(2 x {C:g} x {mtbf:g}) = {yd_torch:.0f} s ({n_torch} steps).  Overhead = stalls + "
        "lost work + restore, hours per job.",
        "",
        "Inputs and where they come from:",
        f"* Restore = restart {args.restart_s:g} s (assumed, both systems) + the system's cold load of the latest "
        f"version.  torch.load: {args.torch_load_s:g} s (assumed, as long as torch.save); deltackpt: "
        f"{ratio:.2f}x that = {ratio * args.torch_load_s:.0f} s, the ratio measured for {args.workload} "
        f"(from {r_source}).  Restore per failure: torch.save {ts.restore:.0f} s, deltackpt {dk_restore:.0f} s.",
        f"* deltackpt's save costs are ratios to {ref_mode}'s stall in one bench/async_stall.py run "
        f"(from {source}{', row ' + args.thread_mode if args.from_bench else ''}): snapshot stall "
        f"{args.stall_ratio:.3f}x, loop slowdown beyond the stall {args.contention_ratio:.3f}x (the larger of the "
        f"paired-cycle median and the overlap estimate{spread}), snapshot to commit {args.background_ratio:.2f}x.",
    ]
    if plain_ratios:
        lines.append(f"* The plain background snapshot (row deltackpt-thread of the same run) for one comparison row: "
                     f"stall {plain_ratios[0]:.3f}x, slowdown beyond it {plain_ratios[1]:.3f}x, commit "
                     f"{plain_ratios[2]:.2f}x.")
    scenarios = [
        ("measured on the project machine (2 shared cores: the background save competes with training)",
         args.contention_ratio, plain_ratios[1] if plain_ratios else 0.0),
        ("spare cores (a GPU node: the background save does not slow the loop; stall = snapshot only)", 0.0, 0.0),
    ]
    best_names = []
    for title, contention, plain_contention in scenarios:
        dk = Costs(C * (args.stall_ratio + contention), C * args.background_ratio, dk_restore)
        plain = Costs(C * (plain_ratios[0] + plain_contention), C * plain_ratios[2], dk_restore) if plain_ratios else None
        table = run_policies(args, dk, ts, mtbf, steps, n_torch, plain)
        base = table[0][4]
        lines += [
            "",
            f"## Scenario: {title}",
            "",
            f"deltackpt background save: loop cost {dk.stall:.3g} s per save (snapshot {args.stall_ratio:.3f}x + "
            f"contention {contention:.3f}x of torch.save), committed {dk.background:.3g} s after the snapshot "
            "(a failure before that loses it).",
            "",
            "| policy | stalls h | lost work h | restore h | total h | total % of useful | vs baseline | saves | failures |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, st, lo, re, tot, sv, fl in table:
            lines.append(f"| {name} | {st / 3600:.2f} | {lo / 3600:.2f} | {re / 3600:.2f} | {tot / 3600:.2f} | "
                         f"{tot / useful:.1%} | {tot / base:.2f}x | {sv:.0f} | {fl:.1f} |")
        best = min(table, key=lambda r: r[4])
        best_names.append((title.split(" (")[0], best[0], dk, plain, base))
        lines += ["", f"Lowest overhead: {best[0]} ({best[4] / base:.2f}x the baseline)."]
    lines += ["", "## Restore ratio by workload", "",
              "Each scenario's lowest-overhead policy again, with the restore ratio measured on each workload "
              f"(from {r_source}); everything else as above.", "",
              "| workload | deltackpt load / torch.load | scenario | restore h | total h | vs baseline |", "|---|---|---|---|---|---|"]
    for w, rw in ratios.items():
        for scen, name, dk, plain, base in best_names:
            costs = Costs(dk.stall, dk.background, args.restart_s + rw * args.torch_load_s)
            pc = Costs(plain.stall, plain.background, costs.restore) if plain else None
            (row,) = run_policies(args, costs, ts, mtbf, steps, n_torch, pc, only={name})
            lines.append(f"| {w} | {rw:.2f}x | {scen} | {row[3] / 3600:.2f} | {row[4] / 3600:.2f} | {row[4] / base:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
