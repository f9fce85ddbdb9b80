"""Fault-tolerance overhead of checkpoint policies over simulated failure traces.

A job needs ``--hours`` of useful training in steps of ``--step-s`` seconds.  Failures arrive
with exponential inter-failure times (mean ``--mtbf-h``, seeded, ``--traces`` traces).  After a
failure the job pays its restore time and continues from the last *committed* checkpoint.
Overhead = stalls (time the loop is blocked by saves, waits included) + lost work (progress since
the last committed checkpoint) + restore time, as a fraction of the useful time.

Restore time, per system: ``--restart-s`` (the same for both) plus that system's cold load of the
latest version: ``--torch-load-s`` for torch.load, ``--restore-ratio`` x that for deltackpt, the
ratio the compare study measures (``--from-results FILE`` reads its JSON, bench/results/compare.json,
else ``MEASURED_RESTORE``).

Checkpoint costs: a blocking ``torch.save`` stalls for ``--torch-save-s`` and is committed when it
returns.  A deltackpt background save stalls for ``--stall-ratio`` x that (the snapshot) plus
``--contention-ratio`` x that (what the background work costs the loop), and is committed
``--background-ratio`` x later; a failure in between loses it.  ``--from-bench KEY`` reads these
ratios from a training_slowdown run recorded in bench/results/training_slowdown.json (or ``FILE``):
a whole-run measurement gives one scenario per condition it measured (every core busy, one core
left free); a paired one (``--paired``, and the runs recorded before the harness) the measured
scenario and one with spare cores, where the save costs the loop nothing beyond its stall.

The policies are deltackpt's own objects (deltackpt/training/policies.py) driven by simulated
time.  The output is bench/POLICIES.md; its training-slowdown section, which the
training_slowdown study writes, is kept as it is.

    python -m bench policy_sim --mtbf-h 1 --torch-save-s 120
    python -m bench policy_sim --from-bench async_i18_full --from-results bench/results/compare.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

from bench.common import record
from bench.common.scratch import scratch
from bench.studies.policy_sim_model import Costs, run_policies
from bench.studies.training_slowdown import BEGIN, END

SUMMARY = "fault-tolerance overhead of checkpoint policies (deltackpt's own policy objects) over simulated failure traces"
WRITES = "bench/POLICIES.md (all but its training-slowdown section; quick: a scratch folder)"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# deltackpt's cold load of the latest version in a fresh process / cold torch.load of it, on this
# machine's 2 cores: minilm-full from load_speed (bench/results/load_speed.json, key
# s43_minilm_vs_a09821e, 2026-12-06); the others from the comparison (format 2, 2026-11-24), not
# measured since.  Decoding on 2 cores is slower than this disk.
MEASURED_RESTORE = {"minilm-full": 1.22, "minilm-frozen": 1.55, "recsys": 0.95, "gpt-bf16": 2.0}
MEASURED_RESTORE_SOURCE = ("MEASURED_RESTORE in bench/studies/policy_sim.py (minilm-full: load_speed, key "
                           "s43_minilm_vs_a09821e, 2026-12-06; the others: the comparison, format 2, 2026-11-24)")


def _mode(rows: dict, mode: str) -> dict:
    """A system's row, under its name before the harness too (deltackpt-thread was deltackpt-background)."""
    old = {"deltackpt-background": "deltackpt-thread"}
    if mode in rows:
        return rows[mode]
    if old.get(mode) in rows:
        return rows[old[mode]]
    raise SystemExit(f"the run has no row {mode!r}; it has: {', '.join(rows)}")


def paired_ratios(p: dict, mode: str) -> tuple[float, float, float, str]:
    """(stall, contention, background) / torch.save stall from a paired-cycle run, and the name of
    the row they are relative to (torch.save+fsync where the run has it: it is durable on return,
    as the simulation's torch.save is)."""
    ref_mode = "torch.save+fsync" if "torch.save+fsync" in p else "torch.save"
    ref, th = p[ref_mode]["stall_median_s"], _mode(p, mode)
    # the overlap estimate when the run has it: the larger and steadier of the two here
    slowdown = max(th["slowdown_median"], th.get("slowdown_overlap_median") or 0.0)
    loop_cost = slowdown * statistics.median(p["none"]["cycle_s"])
    return (th["stall_median_s"] / ref, max(0.0, loop_cost - th["stall_median_s"]) / ref,
            (th.get("background_median_s") or 0.0) / ref, ref_mode)


def whole_run_ratios(res: dict, mode: str) -> tuple[float, float, float, str]:
    """The same from a whole-run measurement: the loop cost per save is the slowdown times the
    no-checkpoint run's time per save interval; what it costs beyond the stall is contention."""
    ref_mode = "torch.save+fsync" if "torch.save+fsync" in res else "torch.save"
    ref, th = res[ref_mode]["stall_median_s"], _mode(res, mode)
    none_wall = statistics.median(x["wall_s"] for x in res["none"]["runs"])
    saves = max(1, th["runs"][0]["saves"])
    stall = th["stall_median_s"] + th.get("step_wait_median_s", 0.0) / saves
    loop_cost = th["slowdown_median"] * none_wall / saves
    return (stall / ref, max(0.0, loop_cost - stall) / ref, (th.get("background_median_s") or 0.0) / ref, ref_mode)


def restore_ratios(results: dict) -> dict[str, float]:
    """Per workload of the comparison's JSON: deltackpt's cold load of the latest version / cold
    torch.load of that version (its "load latest" rollback row, else the last cold loads)."""
    out = {}
    for w in results["results"]:
        rows = [x for x in (w.get("rollback") or {}).get("rows", []) if x.get("by") == 0]
        if rows:
            out[w["workload"]] = rows[0]["s"] / rows[0]["ts_cold_s"]
        elif "load_cold" in w["systems"].get("deltackpt", {}):
            out[w["workload"]] = w["systems"]["deltackpt"]["load_cold"][-1] / w["systems"]["torch.save"]["load_cold"][-1]
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--hours", type=float, default=24.0, help="useful training time")
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--mtbf-h", type=float, default=4.0)
    ap.add_argument("--restart-s", type=float, default=60.0, help="failure to process ready to load (both systems)")
    ap.add_argument("--torch-load-s", type=float, default=60.0, help="cold torch.load of the state")
    ap.add_argument("--restore-ratio", type=float, default=None,
                    help="deltackpt cold load / cold torch.load (default: --workload's measured ratio)")
    ap.add_argument("--from-results", help="the comparison's JSON (bench/results/compare.json): take the restore ratios from it")
    ap.add_argument("--workload", default="minilm-full", help="whose restore ratio the main tables use")
    ap.add_argument("--torch-save-s", type=float, default=60.0, help="blocking torch.save of the state")
    ap.add_argument("--stall-ratio", type=float, default=0.05, help="deltackpt snapshot stall / torch.save")
    ap.add_argument("--contention-ratio", type=float, default=0.05,
                    help="loop time the background save costs (GIL, cores) / torch.save")
    ap.add_argument("--background-ratio", type=float, default=3.0, help="snapshot-to-commit time / torch.save")
    ap.add_argument("--from-bench", metavar="KEY|FILE",
                    help="take the ratios from a training_slowdown run: a KEY of bench/results/training_slowdown.json "
                         "(the runs ASYNC.md and POLICIES.md cite), or the path of such a JSON")
    ap.add_argument("--bench-job", default=None, help="which job of a whole-run measurement (default minilm-full, else its first)")
    ap.add_argument("--thread-mode", default=None,
                    help="which bench row is deltackpt's save (default: deltackpt-lazy if the run has it)")
    ap.add_argument("--traces", type=int, default=None, help="failure traces (default 20, quick 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="default bench/POLICIES.md (quick: a scratch folder)")


CONDITIONS = {"contended": "contended (measured: torch uses every core, the background save competes with training)",
              "free-core": "free-core (measured: torch uses every core but one, which the background save can use)"}


def _load_bench(ref: str) -> tuple[dict, str]:
    if os.path.exists(ref):
        with open(ref) as f:
            return json.load(f), ref
    return record.recorded("training_slowdown", ref), f"bench/results/training_slowdown.json, key {ref}"


def _bench_inputs(args: argparse.Namespace) -> tuple[str, str, list[dict]]:
    """The save-cost ratios, one set per scenario, from ``--from-bench`` or the arguments; returns
    (source, the row they are relative to, scenarios: {title, ratios, plain, note})."""
    given = (args.stall_ratio, args.contention_ratio, args.background_ratio)
    spare = "spare cores (a GPU node: the background save does not slow the loop; stall = snapshot only)"
    if not args.from_bench:
        return "the arguments", "torch.save", [
            {"title": "the arguments' contention", "ratios": given, "plain": None, "note": ""},
            {"title": spare, "ratios": (given[0], 0.0, given[2]), "plain": None, "note": ""}]
    b, source = _load_bench(args.from_bench)
    if "paired" in b:   # a paired run recorded before the harness: its rows, and spare cores beside
        return source, *_paired_scenarios(args, b["paired"], b.get("every"), spare)
    jobs = b["jobs"]
    name = args.bench_job or ("minilm-full" if "minilm-full" in jobs else next(iter(jobs)))
    entry, scenarios, ref_mode = jobs[name], [], "torch.save"
    source += f", job {name}"
    for cond, c in entry["conditions"].items():
        if "paired" in c:
            ref_mode, got = _paired_scenarios(args, c["paired"], entry["every"], None)
            got[0]["title"] = CONDITIONS.get(cond, cond)
            scenarios += got
            continue
        res = c["results"]
        args.thread_mode = args.thread_mode or ("deltackpt-lazy" if "deltackpt-lazy" in res else "deltackpt-background")
        *ratios, ref_mode = whole_run_ratios(res, args.thread_mode)
        plain = tuple(whole_run_ratios(res, "deltackpt-background")[:3]) \
            if args.thread_mode == "deltackpt-lazy" and "deltackpt-background" in res else None
        th = _mode(res, args.thread_mode)
        note = (f" (that run's slowdown: {th['slowdown_median']:+.1%}, each repeat "
                + ", ".join(f"{x:+.1%}" for x in th["slowdown_all"]) + f"; every {entry['every']} steps)")
        scenarios.append({"title": CONDITIONS.get(cond, cond), "ratios": tuple(ratios), "plain": plain, "note": note})
    return source, ref_mode, scenarios


def _paired_scenarios(args: argparse.Namespace, p: dict, every, spare: str | None) -> tuple[str, list[dict]]:
    args.thread_mode = args.thread_mode or ("deltackpt-lazy" if "deltackpt-lazy" in p else "deltackpt-background")
    *ratios, ref_mode = paired_ratios(p, args.thread_mode)
    plain = None
    if args.thread_mode == "deltackpt-lazy" and ("deltackpt-background" in p or "deltackpt-thread" in p):
        plain = tuple(paired_ratios(p, "deltackpt-background")[:3])
    th, note = _mode(p, args.thread_mode), " (the larger of the paired-cycle median and the overlap estimate"
    if "slowdown_median_ci90" in th:   # how sure the contention input is
        lo, hi = th["slowdown_median_ci90"]
        note += (f"; that run's slowdown: paired median {th['slowdown_median']:+.1%} [90% CI {lo:+.1%}, {hi:+.1%}], "
                 f"overlap estimate {_overlap(th)}, every {every} steps")
    note += ")"
    out = [{"title": "measured on the project machine (2 shared cores: the background save competes with training)",
            "ratios": tuple(ratios), "plain": plain, "note": note}]
    if spare:
        out.append({"title": spare, "ratios": (ratios[0], 0.0, ratios[2]),
                    "plain": (plain[0], 0.0, plain[2]) if plain else None, "note": " (assumed)"})
    return ref_mode, out


def _overlap(row: dict) -> str:
    """The overlap estimate of a paired row; none where no step of a cycle ran clear of the save."""
    x = row.get("slowdown_overlap_median")
    return "none (no step of a cycle ran clear of the save)" if x is None else f"{x:+.1%}"


def _restore_inputs(args: argparse.Namespace) -> tuple[dict[str, float], str]:
    """The restore ratio per workload and where it comes from."""
    ratios = dict(MEASURED_RESTORE)
    r_source = MEASURED_RESTORE_SOURCE
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
    source, ref_mode, scenarios = bench
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
    ]
    row = f", row {args.thread_mode}" if args.from_bench else ""
    for sc in scenarios:
        st, co, bg = sc["ratios"]
        lines.append(f"* {sc['title']}: deltackpt's save costs as ratios to {ref_mode}'s stall (from {source}{row}): "
                     f"snapshot stall {st:.3f}x, loop slowdown beyond the stall {co:.3f}x{sc['note']}, snapshot to "
                     f"commit {bg:.2f}x.")
        if sc["plain"]:
            p = sc["plain"]
            lines.append(f"  The plain background snapshot (row deltackpt-background of the same run) for one comparison "
                         f"row: stall {p[0]:.3f}x, slowdown beyond it {p[1]:.3f}x, commit {p[2]:.2f}x.")
    return lines


def _scenario(args, job: _Job, title: str, ratios: tuple, plain_ratios: tuple | None, lines: list[str]) -> tuple:
    """One scenario's table into ``lines``; returns (scenario, best policy, its costs, plain costs, baseline)."""
    C = job.C
    stall, contention, background = ratios
    dk = Costs(C * (stall + contention), C * background, job.dk_restore)
    plain = Costs(C * (plain_ratios[0] + plain_ratios[1]), C * plain_ratios[2], job.dk_restore) if plain_ratios else None
    table = run_policies(args, dk, job.ts, job.mtbf, job.steps, job.n_torch, plain)
    base = table[0][4]
    lines += [
        "",
        f"## Scenario: {title}",
        "",
        f"deltackpt background save: loop cost {dk.stall:.3g} s per save (snapshot {stall:.3f}x + "
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


def _keep_section(path: str, text: str) -> str:
    """``text`` with the training-slowdown section of the file at ``path`` kept, after the head."""
    old = open(path).read() if os.path.exists(path) else ""
    if BEGIN not in old or END not in old:
        return text
    kept = old[old.index(BEGIN):old.index(END) + len(END)]
    head, sep, rest = text.partition("\n## ")
    return head + kept + "\n\n" + sep.lstrip("\n") + rest


def _simulate(args: argparse.Namespace, out: str) -> str:
    bench = _bench_inputs(args)
    ratios, r_source = _restore_inputs(args)
    ratio = ratios[args.workload]
    job = _Job(args, ratio)
    cmd = "python -m bench policy_sim " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["policy_sim"] else [])
    lines = _head(args, job, cmd.strip(), ratio, r_source, bench)
    best_names = [_scenario(args, job, sc["title"], sc["ratios"], sc["plain"], lines) for sc in bench[2]]
    lines += _by_workload(args, job, ratios, r_source, best_names)
    text = _keep_section(out, "\n".join(lines) + "\n")
    with open(out, "w") as f:
        f.write(text)
    return text


def run(args: argparse.Namespace) -> int:
    args.traces = args.traces or (2 if args.quick else 20)
    if not args.quick:
        print(_simulate(args, args.out or os.path.join(HERE, "POLICIES.md")))
        return 0
    args.hours = min(args.hours, 2.0)
    with scratch("deltackpt-bench-policy-", parent=args.tmp) as tmp:
        out = os.path.join(tmp, "POLICIES.md")
        with open(out, "w") as f:   # an earlier POLICIES.md with a measured section, which must survive
            f.write(f"# old\n\nintro\n\n{BEGIN}\n## measured\n{END}\n\n## old scenario\n")
        for ref in (None, "async_i18_full", _whole_run_record(tmp)):   # arguments, a paired run, a whole-run one
            args.from_bench, args.thread_mode = ref, None
            text = _simulate(args, out)
            assert text.count(BEGIN) == 1 and "## old scenario" not in text and "Lowest overhead" in text, text[:2000]
    print(text)
    return 0


def _whole_run_record(tmp: str) -> str:
    """A whole-run training_slowdown measurement of a tiny job, as a JSON file (quick runs)."""
    from bench.studies.training_slowdown import add_arguments as ts_arguments
    from bench.studies.training_slowdown import measure
    ap = argparse.ArgumentParser()
    ts_arguments(ap)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(["--quick", "--systems", "none,torch.save+fsync,deltackpt-background,deltackpt-lazy",
                       "--conditions", "contended,free-core"])
    rec = measure(a, os.path.join(tmp, "slowdown"))
    path = os.path.join(tmp, "slowdown.json")
    with open(path, "w") as f:
        json.dump(rec, f)
    return path
