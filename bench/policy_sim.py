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
``--background-ratio`` x later; a failure in between loses it.  ``--from-bench KEY`` reads these
ratios from a bench/async_stall.py run recorded in bench/results/async.json (or ``FILE``, its --json) (the row ``--thread-mode``, against its torch.save+fsync
row, or torch.save where the run had no fsync row).

The policies are deltackpt's own objects (deltackpt/training/policies.py) driven by simulated time.
    PYTHONPATH=. python bench/policy_sim.py --mtbf-h 1 --torch-save-s 120   # tables + bench/POLICIES.md
    PYTHONPATH=. python bench/policy_sim.py --from-bench async_i18_full --from-results bench/results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import record  # noqa: E402
from bench.policy_model import Costs, run_policies  # noqa: E402


# deltackpt's cold load of the latest version / cold torch.load of it (bench/run.py, format 2, this
# machine's 2 cores, cold page cache, 2026-11-24): decoding on 2 cores is slower than this disk.
MEASURED_RESTORE = {"minilm-full": 1.64, "minilm-frozen": 1.55, "recsys": 0.95, "gpt-bf16": 2.0}


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


def _parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--from-bench", metavar="KEY|FILE",
                    help="take the ratios from a bench/async_stall.py --paired run: a KEY of bench/results/async.json "
                         "(the runs ASYNC.md cites), or the path of a --json output")
    ap.add_argument("--thread-mode", default=None,
                    help="which bench row is deltackpt's save (default: deltackpt-lazy if the run has it)")
    ap.add_argument("--traces", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "POLICIES.md"))
    return ap


def _bench_inputs(args: argparse.Namespace) -> tuple[str, str, tuple | None, str]:
    """Set the save-cost ratios from ``--from-bench``; returns (source, reference row, the plain
    snapshot's ratios or None, how sure the contention input is)."""
    if not args.from_bench:
        return "defaults", "torch.save", None, ""
    if os.path.exists(args.from_bench):
        with open(args.from_bench) as f:
            b = json.load(f)
        source = args.from_bench
    else:
        b = record.recorded("async", args.from_bench)
        source = f"bench/results/async.json, key {args.from_bench}"
    modes = b.get("paired", {})
    args.thread_mode = args.thread_mode or ("deltackpt-lazy" if "deltackpt-lazy" in modes else "deltackpt-thread")
    args.stall_ratio, args.contention_ratio, args.background_ratio, ref_mode = bench_ratios(b, args.thread_mode)
    plain_ratios = None
    if args.thread_mode == "deltackpt-lazy" and "deltackpt-thread" in modes:
        plain_ratios = bench_ratios(b, "deltackpt-thread")[:3]
    th, spread = modes[args.thread_mode], ""
    if "slowdown_median_ci90" in th:   # how sure the contention input is
        lo, hi = th["slowdown_median_ci90"]
        spread = (f"; that run's slowdown: paired median {th['slowdown_median']:+.1%} [90% CI {lo:+.1%}, {hi:+.1%}], "
                  f"overlap estimate {th['slowdown_overlap_median'] or 0:+.1%}, every {b['every']} steps")
    return source, ref_mode, plain_ratios, spread


def _restore_inputs(args: argparse.Namespace) -> tuple[dict[str, float], str]:
    """The restore ratio per workload and where it comes from."""
    ratios = dict(MEASURED_RESTORE)
    r_source = "MEASURED_RESTORE in bench/policy_sim.py (bench/run.py, format 2, cold cache, 2026-11-24)"
    if args.from_results:
        with open(args.from_results) as f:
            ratios = restore_ratios(json.load(f))
        r_source = args.from_results
    if args.restore_ratio is not None:
        ratios[args.workload], r_source = args.restore_ratio, "--restore-ratio"
    return ratios, r_source


class _Job:
    """The simulated job's fixed figures, from the arguments."""

    def __init__(self, args: argparse.Namespace, ratio: float) -> None:
        self.mtbf = args.mtbf_h * 3600
        self.steps = int(args.hours * 3600 / args.step_s)
        self.useful = self.steps * args.step_s
        self.C = args.torch_save_s
        self.yd_torch = math.sqrt(2 * self.C * self.mtbf)                      # Young/Daly optimum for torch.save
        self.n_torch = max(1, round(self.yd_torch / args.step_s))
        self.ts = Costs(self.C, 0.0, args.restart_s + args.torch_load_s)
        self.dk_restore = args.restart_s + ratio * args.torch_load_s


def _head(args, job: _Job, cmd: str, ratio: float, r_source: str, bench: tuple) -> list[str]:
    source, ref_mode, plain_ratios, spread = bench
    C, mtbf = job.C, job.mtbf
    lines = [
        "# Checkpoint policies: simulated fault-tolerance overhead",
        "",
        f"Generated by `{cmd}` ({args.traces} seeded failure traces, seed {args.seed}).",
        "",
        f"Job: {args.hours:g} h of useful training, {args.step_s:g} s steps; failures exponential with MTBF "
        f"{args.mtbf_h:g} h.  torch.save stalls {C:g} s and is committed when it returns.  Young/Daly interval "
        f"for torch.save: sqrt(2 x {C:g} x {mtbf:g}) = {job.yd_torch:.0f} s ({job.n_torch} steps).  Overhead = stalls + "
        "lost work + restore, hours per job.",
        "",
        "Inputs and where they come from:",
        f"* Restore = restart {args.restart_s:g} s (assumed, both systems) + the system's cold load of the latest "
        f"version.  torch.load: {args.torch_load_s:g} s (assumed, as long as torch.save); deltackpt: "
        f"{ratio:.2f}x that = {ratio * args.torch_load_s:.0f} s, the ratio measured for {args.workload} "
        f"(from {r_source}).  Restore per failure: torch.save {job.ts.restore:.0f} s, deltackpt {job.dk_restore:.0f} s.",
        f"* deltackpt's save costs are ratios to {ref_mode}'s stall in one bench/async_stall.py run "
        f"(from {source}{', row ' + args.thread_mode if args.from_bench else ''}): snapshot stall "
        f"{args.stall_ratio:.3f}x, loop slowdown beyond the stall {args.contention_ratio:.3f}x (the larger of the "
        f"paired-cycle median and the overlap estimate{spread}), snapshot to commit {args.background_ratio:.2f}x.",
    ]
    if plain_ratios:
        lines.append(f"* The plain background snapshot (row deltackpt-thread of the same run) for one comparison row: "
                     f"stall {plain_ratios[0]:.3f}x, slowdown beyond it {plain_ratios[1]:.3f}x, commit "
                     f"{plain_ratios[2]:.2f}x.")
    return lines


def _scenario(args, job: _Job, title: str, contention: float, plain_contention: float, plain_ratios, lines) -> tuple:
    """One scenario's table into ``lines``; returns (scenario, best policy, its costs, plain costs, baseline)."""
    C = job.C
    dk = Costs(C * (args.stall_ratio + contention), C * args.background_ratio, job.dk_restore)
    plain = Costs(C * (plain_ratios[0] + plain_contention), C * plain_ratios[2], job.dk_restore) if plain_ratios else None
    table = run_policies(args, dk, job.ts, job.mtbf, job.steps, job.n_torch, plain)
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
                     f"{tot / job.useful:.1%} | {tot / base:.2f}x | {sv:.0f} | {fl:.1f} |")
    best = min(table, key=lambda r: r[4])
    lines += ["", f"Lowest overhead: {best[0]} ({best[4] / base:.2f}x the baseline)."]
    return title.split(" (")[0], best[0], dk, plain, base


def _by_workload(args, job: _Job, ratios: dict[str, float], r_source: str, best_names: list[tuple]) -> list[str]:
    lines = ["", "## Restore ratio by workload", "",
             "Each scenario's lowest-overhead policy again, with the restore ratio measured on each workload "
             f"(from {r_source}); everything else as above.", "",
             "| workload | deltackpt load / torch.load | scenario | restore h | total h | vs baseline |", "|---|---|---|---|---|---|"]
    for w, rw in ratios.items():
        for scen, name, dk, plain, base in best_names:
            costs = Costs(dk.stall, dk.background, args.restart_s + rw * args.torch_load_s)
            pc = Costs(plain.stall, plain.background, costs.restore) if plain else None
            (row,) = run_policies(args, costs, job.ts, job.mtbf, job.steps, job.n_torch, pc, only={name})
            lines.append(f"| {w} | {rw:.2f}x | {scen} | {row[3] / 3600:.2f} | {row[4] / 3600:.2f} | {row[4] / base:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    bench = _bench_inputs(args)
    plain_ratios = bench[2]
    ratios, r_source = _restore_inputs(args)
    ratio = ratios[args.workload]
    job = _Job(args, ratio)
    cmd = " ".join(["PYTHONPATH=. python bench/policy_sim.py"] + (argv if argv is not None else sys.argv[1:]))
    lines = _head(args, job, cmd, ratio, r_source, bench)
    scenarios = [
        ("measured on the project machine (2 shared cores: the background save competes with training)",
         args.contention_ratio, plain_ratios[1] if plain_ratios else 0.0),
        ("spare cores (a GPU node: the background save does not slow the loop; stall = snapshot only)", 0.0, 0.0),
    ]
    best_names = [_scenario(args, job, title, contention, plain_contention, plain_ratios, lines)
                  for title, contention, plain_contention in scenarios]
    lines += _by_workload(args, job, ratios, r_source, best_names)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
