"""How much checkpointing slows a real training loop down, end to end, system by system.

    python -m bench training_slowdown                  # MiniLM full fine-tune and GPT-2 small, a save every 20 steps
    python -m bench training_slowdown --jobs gpt2 --repeats 5 --record gpt2_every20
    python -m bench training_slowdown --systems none,torch.save+fsync,deltackpt-background,cpu-burn --burn-s 0.5
    python -m bench training_slowdown --paired 12 --jobs minilm-full --every 10   # paired cycles (see _paired.py)
    python -m bench training_slowdown --quick          # CI: a tiny GPT-2, a few steps; checks every restore

A job (bench/common/jobs.py) trains for real; every ``--every`` steps (N, 20 by default) the state
(model + optimizer) is checkpointed by one system (bench/studies/training_slowdown_savers.py): none,
torch.save + fsync (blocking), DCP's ``async_save`` in one process, deltackpt blocking, in the
background (``blocking=False``) and in the background with the lazy snapshot (``optimizer=``).  A
run is ``--saves`` checkpoints and N steps after the last (so every save has an interval to overlap,
as it would in a long run), after one untimed save (in a long run, saves are later ones).  Runs
repeat ``--repeats`` times, the systems taking turns in an order that rotates, so that a burst of
load from elsewhere hits all alike.  Slowdown = the median over repeats of (the run's loop wall
time / the no-checkpoint run's of the same repeat) - 1; the wait for the last background save after
the loop is reported apart (``tail``), not counted.

Two conditions: ``free-core`` (torch uses all cores but one: the one a background save is meant to
use) and ``contended`` (torch uses every core).  Results print as tables, go to
bench/results/training_slowdown.json with ``--record KEY``, and a measurement (whole runs or paired
cycles) rewrites the training-slowdown section of bench/POLICIES.md (``--policies PATH`` elsewhere, ``--no-policies``
not at all, ``--from-record KEY`` rewrites it from a recorded run without measuring).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import time

import torch

from bench.common import record
from bench.common.jobs import JOBS, make_job
from bench.common.measure import digests
from bench.common.scratch import scratch
from bench.studies import training_slowdown_savers as savers

SUMMARY = ("training slowdown end to end from checkpointing every N steps: none, torch.save+fsync, DCP async_save, "
           "deltackpt blocking / background / lazy; one core left free vs all cores busy")
WRITES = "stdout; --record KEY: bench/results/training_slowdown.json; full runs: bench/POLICIES.md's training-slowdown section"

DEFAULT_SYSTEMS = "none,torch.save+fsync,dcp-async,deltackpt-blocking,deltackpt-background,deltackpt-lazy"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- training_slowdown: begin -->", "<!-- training_slowdown: end -->"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--jobs", default=None, help=f"comma-separated, of {', '.join(JOBS)} (default minilm-full,gpt2; quick gpt2 tiny)")
    ap.add_argument("--systems", default=None, help=f"comma-separated, of {', '.join(savers.SYSTEMS)} "
                    f"(default {DEFAULT_SYSTEMS}); with --paired, ';' separates rotations run one after the other")
    ap.add_argument("--every", type=int, default=None, help="steps between checkpoints, N (default 20; 0: from --share)")
    ap.add_argument("--share", type=float, default=0.15, help="with --every 0: N where torch.save costs this share of the loop")
    ap.add_argument("--saves", type=int, default=None, help="checkpoints per run (default 3, quick 2)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per system and condition (default 3, quick 1)")
    ap.add_argument("--conditions", default="free-core,contended",
                    help="free-core: torch threads = cores - 1; contended: = cores (comma-separated)")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default: the job's)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default: the job's)")
    ap.add_argument("--burn-s", type=float, default=None, help="CPU seconds per save point of the *-burn systems (default 1, quick 0.05)")
    ap.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                    help="instead of whole runs: ROUNDS rounds of one N-step cycle per system (training_slowdown_paired.py)")
    ap.add_argument("--record", default=None, metavar="KEY", help="store the figures as run KEY of results/training_slowdown.json")
    ap.add_argument("--policies", default=None, metavar="PATH",
                    help="POLICIES.md whose training-slowdown section to rewrite (default: bench/POLICIES.md after a "
                         "measurement; quick: a copy in the scratch folder)")
    ap.add_argument("--no-policies", action="store_true", help="leave POLICIES.md alone (an ad-hoc run)")
    ap.add_argument("--from-record", default=None, metavar="KEY",
                    help="rewrite the POLICIES.md section from recorded run KEY, measuring nothing")
    ap.add_argument("--dir", default=None, help="working folder, kept (default: a scratch folder, removed)")


def threads_for(condition: str) -> int:
    cores = os.cpu_count() or 1
    if condition == "free-core":
        return max(1, cores - 1)
    if condition == "contended":
        return cores
    raise SystemExit(f"unknown condition {condition!r} (free-core, contended)")


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its reaped children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_once(job, system: str, every: int, saves: int, workdir: str, burn_s: float, check: bool) -> dict:
    """One run: an untimed first save, then ``saves`` checkpoints ``every`` steps apart and ``every``
    steps after the last.  ``check``: the last checkpoint is restored and compared with the state
    it was taken of."""
    saver = savers.make(system, os.path.join(workdir, system), burn_s)
    stalls, bgs, steps_s = [], [], []
    expected = None
    try:
        saver.save(job, 0)          # the first save writes everything; a long run's saves are later ones
        saver.wait()
        c0, t0 = _cpu(), time.perf_counter()
        for i in range(1, (saves + 1) * every + 1):
            s0 = time.perf_counter()
            job.step()
            steps_s.append(time.perf_counter() - s0)
            if i % every == 0 and i <= saves * every:
                if check and i == saves * every:
                    expected = digests(job.state())
                s0 = time.perf_counter()
                bgs.append(saver.wait())   # a save still running when the next is due: the loop waits, and that is stall
                saver.save(job, i)
                stalls.append(time.perf_counter() - s0)
        wall = time.perf_counter() - t0
        tail0 = time.perf_counter()
        bgs.append(saver.wait())
        tail = time.perf_counter() - tail0
        cpu = _cpu() - c0
        waits = saver.step_wait()
    finally:
        saver.close()
    ok = None
    try:
        if check and system != "none" and not system.endswith("-burn"):
            ok = digests(savers.restored(saver)) == expected
    finally:   # each run starts from an empty folder (its untimed first save writes everything)
        shutil.rmtree(saver.workdir, ignore_errors=True)
    bgs = [b for b in bgs if b is not None]
    return {"system": system, "wall_s": wall, "tail_s": tail, "cpu_s": cpu, "stalls_s": stalls,
            "stall_median_s": statistics.median(stalls) if stalls else 0.0, "step_wait_s": waits,
            "background_median_s": statistics.median(bgs) if bgs else None,
            "step_median_s": statistics.median(steps_s), "steps": len(steps_s), "saves": len(stalls), "ok": ok}


def whole_runs(job, systems: list[str], every: int, saves: int, repeats: int, workdir: str, burn_s: float,
               check: bool) -> dict:
    """``repeats`` rounds of one run per system, the order rotating; per system the slowdown
    against the same round's no-checkpoint run."""
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for r in range(repeats):
        for s in systems[r % len(systems):] + systems[:r % len(systems)]:
            res = run_once(job, s, every, saves, workdir, burn_s, check)
            runs[s].append(res)
            print(f"  round {r + 1} {s:22s} loop {res['wall_s']:7.2f} s  stall/save {res['stall_median_s']:.3f} s  "
                  f"tail {res['tail_s']:.2f} s  median step {res['step_median_s']:.3f} s", flush=True)
    none = runs["none"]
    ref = runs.get("torch.save+fsync") or runs.get("torch.save")
    ref_stall = statistics.median(s for x in ref for s in x["stalls_s"]) if ref else None
    out = {}
    for s, xs in runs.items():
        ratios = [x["wall_s"] / n["wall_s"] - 1 for x, n in zip(xs, none)]
        stall = statistics.median(v for x in xs for v in x["stalls_s"]) if xs[0]["stalls_s"] else 0.0
        bgs = [x["background_median_s"] for x in xs if x["background_median_s"] is not None]
        out[s] = {"slowdown_median": statistics.median(ratios), "slowdown_all": ratios,
                  "slowdown_total": sum(x["wall_s"] for x in xs) / sum(n["wall_s"] for n in none) - 1,
                  "stall_median_s": stall, "stall_ratio": stall / ref_stall if ref_stall else None,
                  "step_wait_median_s": statistics.median(x["step_wait_s"] for x in xs),
                  "background_median_s": statistics.median(bgs) if bgs else None,
                  "tail_median_s": statistics.median(x["tail_s"] for x in xs),
                  "cpu_per_save_s": statistics.median((x["cpu_s"] - n["cpu_s"]) / max(1, x["saves"]) for x, n in zip(xs, none)),
                  "ok": [x["ok"] for x in xs], "runs": xs}
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}"


def table(res: dict) -> list[str]:
    lines = ["| system | slowdown, median of repeats (each repeat) | total | stall per save | stall / torch.save+fsync | "
             "background s per save | loop's wait for a lazy copy, s per run | CPU s per save | tail s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s, r in res.items():
        each = ", ".join(f"{x:+.1%}" for x in r["slowdown_all"])
        ratio = "–" if r["stall_ratio"] is None else f"{r['stall_ratio']:.3f}x"
        bg = "–" if r["background_median_s"] is None else f"{r['background_median_s']:.2f}"
        lines.append(f"| {s} | {_pct(r['slowdown_median'])} ({each}) | {_pct(r['slowdown_total'])} | "
                     f"{r['stall_median_s']:.3f} s | {ratio} | {bg} | {r['step_wait_median_s']:.3f} | "
                     f"{r['cpu_per_save_s']:.2f} | {r['tail_median_s']:.2f} |")
    return lines


def _calibrate_every(job, workdir: str, share: float) -> int:
    """N where an unsynced torch.save costs ``share`` of the loop (from a step and a save timed here)."""
    for _ in range(3):
        job.step()
    t0 = time.perf_counter()
    for _ in range(3):
        job.step()
    step_s = (time.perf_counter() - t0) / 3
    saver = savers.make("torch.save", os.path.join(workdir, "calibrate"))
    t0 = time.perf_counter()
    saver.save(job, 0)
    return max(1, round((time.perf_counter() - t0) / (share * step_s)))


def _job_kwargs(a: argparse.Namespace) -> dict:
    return {"batch": a.batch, "seq": a.seq, "tiny": a.quick}


def measure(a: argparse.Namespace, workdir: str) -> dict:
    jobs = (a.jobs or ("gpt2" if a.quick else "minilm-full,gpt2")).split(",")
    every = 2 if a.quick and a.every is None else (20 if a.every is None else a.every)
    saves, repeats = a.saves or (2 if a.quick else 3), a.repeats or (1 if a.quick else 3)
    burn_s = a.burn_s if a.burn_s is not None else (0.05 if a.quick else 1.0)
    spec = a.systems or (DEFAULT_SYSTEMS + (",cpu-burn,deltackpt-process" if a.quick else ""))
    out: dict = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "command": "python -m bench training_slowdown " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["training_slowdown"] else []),
                 "cores": os.cpu_count(), "every": every, "saves": saves, "repeats": repeats, "quick": a.quick,
                 "loadavg_start": os.getloadavg(), "jobs": {}}
    for name in jobs:
        job = make_job(name, **_job_kwargs(a))
        n = every or _calibrate_every(job, workdir, a.share)
        entry: dict = {"state_bytes": job.state_bytes(), "every": n, "conditions": {}}
        for cond in a.conditions.split(","):
            torch.set_num_threads(threads_for(cond))
            print(f"{name}: weights {entry['state_bytes'] / 2**20:.0f} MiB, a save every {n} steps, {cond} "
                  f"({torch.get_num_threads()} torch threads of {os.cpu_count()} cores)", flush=True)
            if a.paired:
                from bench.studies.training_slowdown_paired import print_table, run_rotations
                res = run_rotations(job, n, spec, a.paired, os.path.join(workdir, f"{name}-{cond}"), burn_s)
                print_table(res)
                entry["conditions"][cond] = {"threads": torch.get_num_threads(), "rounds": a.paired, "paired": res}
                continue
            systems = [s for s in spec.replace(";", ",").split(",") if s]
            systems = systems if "none" in systems else ["none"] + systems
            res = whole_runs(job, systems, n, saves, repeats, os.path.join(workdir, f"{name}-{cond}"), burn_s, a.quick)
            print("\n".join(table(res)) + "\n", flush=True)
            entry["conditions"][cond] = {"threads": torch.get_num_threads(), "steps": (saves + 1) * n, "results": res}
        # measured once the job has trained: an optimizer's moments exist only after its first step,
        # and they are most of what a checkpoint holds (AdamW: twice the weights)
        entry["state_bytes"] = job.state_bytes()
        out["jobs"][name] = entry
        del job
    out["loadavg_end"] = os.getloadavg()
    return out


def paired_table(res: dict) -> list[str]:
    """A paired-cycle measurement's rows, as POLICIES.md shows them."""
    ref = res.get("torch.save+fsync") or res.get("torch.save")
    lines = ["| system | slowdown, paired median [90% CI] | mean | stall per save | stall / torch.save+fsync | "
             "overlap estimate | loop's run-queue wait per cycle | background s per save |",
             "|---|---|---|---|---|---|---|---|"]
    for s, r in res.items():
        lo, hi = r["slowdown_median_ci90"]
        ratio = f"{r['stall_median_s'] / ref['stall_median_s']:.3f}x" if ref and ref["stall_median_s"] else "–"
        ov = "–" if r.get("slowdown_overlap_median") is None else _pct(r["slowdown_overlap_median"])
        bg = r.get("background_median_s")
        lines.append(f"| {s} | {_pct(r['slowdown_median'])} [{lo:+.1%}, {hi:+.1%}] | {_pct(r['slowdown_mean'])} | "
                     f"{r['stall_median_s']:.3f} s | {ratio} | {ov} | {r['loop_runq_median_s']:.3f} s | "
                     f"{'–' if bg is None else f'{bg:.2f}'} |")
    return lines


_WHOLE_RUNS = ("Each job trains for real and checkpoints its model + optimizer every N steps: {saves} checkpoints "
               "per run and N steps after the last, after one untimed save; {repeats} repeats, the systems "
               "interleaved in a rotating order.  Slowdown = median over repeats of (loop wall / the no-checkpoint "
               "run's of the same repeat) - 1, each repeat's in brackets; the wait for the last background save "
               "after the loop is the tail, not counted.")
_PAIRED = ("Each job trains for real; the systems take turns cycle by cycle, a cycle being one system's save of "
           "model + optimizer and the N steps after it, ended only when its background work has finished (a "
           "later save would wait for it), after one warm-up round.  Slowdown = median over rounds of (cycle time "
           "/ the no-checkpoint cycle of the same round) - 1, with a 90% bootstrap interval of that median and the "
           "mean; the overlap estimate counts the stall and the extra time of the steps that ran beside the save.")


def section(rec: dict, key: str | None) -> str:
    """The training-slowdown section of POLICIES.md from one measurement, whole runs or paired cycles."""
    la0, la1 = rec.get("loadavg_start", [0, 0, 0]), rec.get("loadavg_end", [0, 0, 0])
    paired = any("paired" in c for e in rec["jobs"].values() for c in e["conditions"].values())
    method = _PAIRED if paired else _WHOLE_RUNS.format(saves=rec["saves"], repeats=rec["repeats"])
    lines = [BEGIN, "## Training slowdown from checkpointing, measured", "",
             f"Measured {rec['date']} by `{rec['command'].strip()}`"
             + (f" (bench/results/training_slowdown.json, key `{key}`)" if key else "")
             + f" on {rec['cores']} cores; load average {la0[0]:.1f} at the start, {la1[0]:.1f} at the end.", "",
             method + "  Stall = the save call as the loop sees it, waiting for a save still running included.  "
             "free-core: torch uses every core but one; contended: every core."
             + (" **A quick run: tiny sizes, no claims.**" if rec.get("quick") else ""), ""]
    for name, entry in rec["jobs"].items():
        for cond, c in entry["conditions"].items():
            head = f"### {name} ({entry['state_bytes'] / 2**20:.0f} MiB of state), {cond}: {c['threads']} torch " \
                   f"threads, a checkpoint every {entry['every']} steps"
            if "paired" in c:
                lines += [f"{head}, {c['rounds']} paired rounds", ""] + paired_table(c["paired"]) + [""]
            elif "results" in c:
                lines += [f"{head}, {c['steps']} steps per run", ""] + table(c["results"]) + [""]
    return "\n".join(lines + [END])


def write_section(path: str, text: str) -> None:
    """Put ``text`` in place of POLICIES.md's training-slowdown section (after the title and the
    paragraph below it where there is none yet); the rest, policy_sim's, stays."""
    old = open(path).read() if os.path.exists(path) else "# Checkpoint policies\n"
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        head, sep, rest = old.partition("\n\n")
        head2, sep2, rest2 = rest.partition("\n\n")
        new = head + sep + head2 + sep2 + text + "\n\n" + rest2 if sep2 else old.rstrip("\n") + "\n\n" + text + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, path)


def _check_quick(out: dict) -> None:
    for name, entry in out["jobs"].items():
        for cond, c in entry["conditions"].items():
            res = c.get("results") or {}
            for s, r in res.items():
                assert all(x["saves"] for x in r["runs"]) or s == "none", f"{name} {cond} {s}: no save ran"
                assert all(ok is not False for ok in r["ok"]), f"{name} {cond} {s}: the last checkpoint did not restore bit-identically"
                assert s in ("none",) or s.endswith("-burn") or all(r["ok"]), f"{name} {cond} {s}: restore not checked"


def run(a: argparse.Namespace) -> int:
    if a.from_record:
        write_section(a.policies or os.path.join(HERE, "POLICIES.md"), section(record.recorded("training_slowdown", a.from_record), a.from_record))
        return 0
    with scratch("deltackpt-bench-slowdown-", keep=a.dir, parent=a.tmp) as workdir:
        out = measure(a, workdir)
        if a.quick:
            _check_quick(out)
            if a.paired == 0:   # the paired cycles and the record and POLICIES.md writers run too, into scratch
                from bench.studies.training_slowdown_paired import print_table, run_rotations
                job = make_job("gpt2", tiny=True)
                paired = run_rotations(job, 2, "none,deltackpt-background;none,torch.save,mem-burn", 2,
                                       os.path.join(workdir, "paired"), 0.05)
                print_table(paired)
                as_paired = dict(out, jobs={"gpt2": {"state_bytes": 1, "every": 2, "conditions": {
                    "free-core": {"threads": 1, "rounds": 2, "paired": paired}}}})
                assert "2 paired rounds" in section(as_paired, None)
            record.record("training_slowdown", "quick", out, folder=workdir)
            pol = os.path.join(workdir, "POLICIES.md")
            write_section(pol, section(out, "quick"))
            write_section(pol, section(out, "quick"))   # a second write replaces, not appends
            assert open(pol).read().count(BEGIN) == 1
            return 0
    if a.record:
        print(f"recorded as {a.record} in {record.record('training_slowdown', a.record, out)}")
    if not a.no_policies:
        path = a.policies or os.path.join(HERE, "POLICIES.md")
        write_section(path, section(out, a.record))
        print(f"rewrote the training-slowdown section of {path}")
    return 0
