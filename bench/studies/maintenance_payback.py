"""What maintenance (deltification after each save) costs and what it saves, at each ``payback``.

A save writes each changed chunk once, whole or as a small forward delta; deltification later
re-stores older versions' whole copies as reverse deltas, which costs writing those deltas (and
copying what survives in rewritten packs) and the CPU to decode and encode them, to save stored
bytes and to make a live rollback by one version read a delta instead of a keyframe.  ``payback``
is the rule that decides: a rewrite is done only where the stored bytes it saves are at least
``payback`` x the bytes it writes (``deltackpt.Repo(..., payback=...)``; default 1.0).

For each workload and payback value (plus ``off``: no maintenance at all) this saves every version
through one handle with deltification on, and measures per save, maintenance included: bytes
handed to ``write()`` (``/proc/self/io`` wchar) and CPU seconds (user and system apart), as ratios
to ``torch.save`` + fsync of the same state, measured right before each save into a file kept until
the run ends (both sides keep every version and see the same page cache: on this VM the kernel's
CPU for the same written bytes varies ~10x with the state of free memory, so an anchor measured
apart from the saves is no anchor); then the repository's stored bytes per version,
and a live rollback by one version (the model holds the newest version; bytes the restore reads).

    python -m bench maintenance_payback                   # MiniLM full and frozen, recsys, the CNN, GPT-2 small
    python -m bench maintenance_payback --workloads recsys,minilm-frozen --paybacks off,0.05,1
    python -m bench maintenance_payback --workloads minilm-full --versions 10 --paybacks off,0.05,1
    python -m bench maintenance_payback --workloads minilm-full --every 2 --versions 8 --paybacks 1   # frequent saves
    python -m bench maintenance_payback --workloads cnn --versions 40 --paybacks off,1   # a 4 MB state, long
    python -m bench maintenance_payback --quick           # CI: tiny states, every version restores

Writes bench/results/maintenance_payback.json (``--record KEY``) and prints a table; the chart of
stored bytes against bytes written and CPU is bench/charts/maintenance_payback.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from typing import Any

from bench.common.measure import digests, measured, same
from bench.common.record import record
from bench.common.scratch import scratch
from bench.common.systems import folder_bytes, torch_save_file
from bench.common import workloads as wl
from bench.common.workloads import workloads

SUMMARY = "deltification's cost (bytes written, CPU) against what it saves (stored bytes, rollback reads), per payback"
WRITES = "stdout; --record KEY: bench/results/maintenance_payback.json; --chart: bench/charts/maintenance_payback.png"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", default=None,
                    help="comma-separated (default minilm-full,minilm-frozen,recsys,cnn,gpt2-adamw; quick: the tiny ones)")
    ap.add_argument("--paybacks", default="off,0.05,0.25,1,4", help="comma-separated payback values, 'off' for none")
    ap.add_argument("--cache", default=os.environ.get("DELTACKPT_BENCH_CACHE"), help="the GPT-2 run's trained versions")
    ap.add_argument("--versions", type=int, default=None,
                    help="versions of minilm-full, minilm-frozen and recsys (default: the workloads' own, 4-6)")
    ap.add_argument("--every", type=int, default=None,
                    help="training steps between the MiniLM versions (default 20; a small value such as 2 is "
                         "frequent checkpointing, where each save's change is small)")
    ap.add_argument("--record", help="store the results under this key")
    ap.add_argument("--chart", action="store_true", help="draw bench/charts/maintenance_payback.png")


def _one(states: list[dict], live: dict | None, payback: str, path: str, anchors: str) -> dict[str, Any]:
    """Every state saved through one handle, each right after its anchor: ``torch.save`` + fsync of
    the same state to a file of its own in ``anchors``, kept until the run ends (every version kept,
    on both sides), so that both see the same page cache and the same free memory."""
    import deltackpt
    deltify = payback != "off"
    per: list[dict[str, float]] = []
    anchor: list[dict[str, float]] = []
    os.makedirs(anchors)
    try:
        with deltackpt.Repo(path, create=True, deltify=deltify, **({"payback": float(payback)} if deltify else {})) as repo:
            for i, s in enumerate(states):
                f = os.path.join(anchors, f"v{i}.pt")
                _, a = measured(lambda: torch_save_file(s, f, fsync=True))
                anchor.append({**a, "bytes": os.path.getsize(f)})
                v, c = measured(lambda: repo.save(s, step=i))
                m = repo.session.last_maintenance   # the step this save ran after it committed
                per.append({**c, "save_written": v.written_bytes,
                            "maintenance_written": getattr(m, "written_bytes", 0), "maintenance_s": getattr(m, "seconds", 0.0)})
    finally:
        shutil.rmtree(anchors)
    stored = folder_bytes(path)
    rollback = None
    if live is not None and len(states) > 1:
        from bench.studies.compare_rollback import live_rollback
        digs = [digests(s) for s in states]
        r = live_rollback(path, 1, live, digs)
        rollback = {"read": r["store_read"], "ok": r["ok"], "objects_mean": r.get("objects_mean")}
    ok = True
    with deltackpt.Repo(path) as repo:
        for k in range(len(states)):
            ok = ok and same(digests(states[len(states) - 1 - k]), repo.load(f"latest~{k}"))
    return {"per_save": per, "anchor": anchor, "stored": stored, "rollback": rollback, "ok": ok}


def _summary(res: dict[str, Any]) -> dict[str, float]:
    """Ratios over the later saves (the first writes every chunk): bytes per save as the median of
    per-save ratios; CPU as the ratio of the sums (one save's system time swings too much)."""
    per, anchor = res["per_save"], res["anchor"]
    later = range(1, len(anchor))
    ts_bytes = statistics.median(anchor[i]["bytes"] for i in later)

    def ratio(key: str) -> float:
        return sum(per[i][key] for i in later) / max(sum(anchor[i][key] for i in later), 1e-4)
    out = {"written_per_save": statistics.median(per[i]["written"] / anchor[i]["bytes"] for i in later),
           "written_last_save": per[-1]["written"] / anchor[-1]["bytes"],
           "maintenance_written": sum(p["maintenance_written"] for p in per) / ts_bytes / max(1, len(per) - 1),
           "cpu_per_save": ratio("cpu"), "user_per_save": ratio("user"), "sys_per_save": ratio("sys"),
           "cpu_s": statistics.median(per[i]["cpu"] for i in later),
           "user_s": statistics.median(per[i]["user"] for i in later),
           "faults_per_save": statistics.median(per[i].get("faults", 0) for i in later),
           "torch_save_faults": statistics.median(anchor[i].get("faults", 0) for i in later),
           "stored_per_version": res["stored"] / ts_bytes / len(per),
           "torch_save_bytes": ts_bytes,
           "torch_save_cpu_s": statistics.median(anchor[i]["cpu"] for i in later),
           "torch_save_user_s": statistics.median(anchor[i]["user"] for i in later)}
    if res["rollback"] is not None:
        out["rollback_read"] = res["rollback"]["read"] / ts_bytes
    return out


def run(args: argparse.Namespace) -> int:
    chosen = (args.workloads.split(",") if args.workloads else
              ["minilm-frozen", "recsys"] if args.quick else ["minilm-full", "minilm-frozen", "recsys", "cnn", "gpt2-adamw"])
    paybacks = args.paybacks.split(",")
    if args.quick:
        paybacks = ["off", "0.05", "1"]
    by_name = {w.name: w for w in workloads(args.quick, cache=args.cache)}
    # a 4 MB state of many small tensors (not among compare's workloads): where a save's fixed costs
    # and maintenance's per-chunk costs show (bench/MAINTENANCE.md, "Small positions")
    cnn_versions = args.versions or (3 if args.quick else 12)
    by_name["cnn"] = wl.Workload("cnn", lambda live=None: wl.cnn(cnn_versions, live=live), "4", cnn_versions)
    if (args.versions or args.every) and not args.quick:   # a longer run, or another interval
        every = args.every or 20
        longer = {"minilm-full": lambda n, live=None: wl.minilm(n, every=every, live=live),
                  "minilm-frozen": lambda n, live=None: wl.minilm(n, every=every, frozen=True, live=live),
                  "recsys": lambda n, live=None: wl.recsys(n, every=40, live=live)}
        for name, make in longer.items():
            n = args.versions or by_name[name].versions
            by_name[name] = wl.Workload(name, lambda live=None, make=make, n=n: make(n, live=live), by_name[name].layer, n)
    results: dict[str, Any] = {}
    with scratch("deltackpt-bench-payback-", parent=args.tmp) as work:
        for name in chosen:
            w = by_name[name]
            live: dict = {}
            states = list(w.make(live=live))
            results[name] = {"versions": len(states), "paybacks": {}}
            for p in paybacks:
                if live:   # the live model holds the newest version again before each rollback measure
                    pass
                res = _one(states, live or None, p, os.path.join(work, f"{name}-{p}"), os.path.join(work, f"anchor-{name}-{p}"))
                results[name]["paybacks"][p] = {**res, "summary": _summary(res)}
                s = results[name]["paybacks"][p]["summary"]
                print(json.dumps({"workload": name, "payback": p, "ok": res["ok"],
                                  **{k: round(v, 4) for k, v in s.items() if isinstance(v, float)}}), flush=True)
                assert res["ok"], (name, p)
            del states
    _table(results)
    if args.record and not args.quick:
        record("maintenance_payback", args.record, results)
    if args.chart and not args.quick:
        _chart(results, os.path.join(HERE, "charts", "maintenance_payback.png"))
    return 0


def _table(results: dict[str, Any]) -> None:
    print("\n| workload | payback | written / save (maintenance incl.) | maintenance written / save "
          "| CPU / save vs torch.save+fsync (user, system) | CPU s / save (torch.save) "
          "| page faults / save (torch.save) | stored / version | live rollback by one: read |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for p, pr in r["paybacks"].items():
            s = pr["summary"]
            rb = f"{s['rollback_read']:.3f}" if "rollback_read" in s else "-"
            print(f"| {name} | {p} | {s['written_per_save']:.3f} (last {s['written_last_save']:.3f}) | "
                  f"{s['maintenance_written']:.3f} | {s['cpu_per_save']:.2f}x ({s['user_per_save']:.2f}x, "
                  f"{s['sys_per_save']:.2f}x) | {s['cpu_s']:.2f} ({s['torch_save_cpu_s']:.2f}) | "
                  f"{s.get('faults_per_save', 0):,.0f} ({s.get('torch_save_faults', 0):,.0f}) | "
                  f"{s['stored_per_version']:.3f} | {rb} |")


def _chart(results: dict[str, Any], out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, r in results.items():
        pts = [(p, pr["summary"]) for p, pr in r["paybacks"].items()]
        xs = [s["written_per_save"] for _, s in pts]
        cs = [s["cpu_per_save"] for _, s in pts]
        ys = [s["stored_per_version"] for _, s in pts]
        for ax, x in ((axes[0], xs), (axes[1], cs)):
            ax.plot(x, ys, marker="o", label=name)
            for (p, _), xi, yi in zip(pts, x, ys):
                ax.annotate(p, (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes[0].set_xlabel("bytes written per save, maintenance included (x torch.save)")
    axes[1].set_xlabel("CPU per save, maintenance included (x torch.save+fsync)")
    for ax in axes:
        ax.set_ylabel("stored per version (x torch.save)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("deltification at each payback (annotated): what it writes and burns against what it saves")
    fig.tight_layout()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=110)
