"""Recovery from a divergence: the guard's in-place rollback against the by-hand alternative
(stop, ``torch.load`` the last good file, restart), measured in the same run.

Each workload of bench/common/workloads.py trains for real; every ``every`` steps its state is saved twice,
into a deltackpt repository and as a ``torch.save`` file (what a team restarting by hand would
load).  After version ``--blow-up-after`` the learning rate is multiplied by 1000 (a schedule bug):
the loss spikes, the guard fed every step's loss fires and rolls model and optimizer back in place
to the newest sound version, then training goes on.  At that moment, for the same target version:

* guard: wall time of the ``check`` that fired (restore + committing the restored state + the
  event record), the restore alone, and the bytes of chunk objects it read (plus index and
  manifest bytes);
* by hand, in process: ``torch.load`` of that version's file and ``load_state_dict`` into the
  live model and optimizer; bytes read = the file's size;
* by hand, restart: a fresh Python process (bench/studies/guard_recovery_restart.py) that imports
  torch, builds the model and optimizer and loads the file: the wall time from its start to ready.

Files were just written, so both read from the page cache.

    python -m bench guard_recovery                  # all workloads, prints a table
    python -m bench guard_recovery --record main    # and stores it in bench/results/guard_recovery.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import torch

from bench.common import workloads as w
from bench.common.measure import digests
from bench.common.record import record
from bench.common.repo_internals import open_counted
from bench.common.scratch import scratch

SUMMARY = ("recovering from a divergence: the guard's in-place rollback against torch.load + load_state_dict "
           "and against a restart, on the same target version")
WRITES = "stdout; --record KEY: bench/results/guard_recovery.json"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name -> (generator factory taking live/trace, versions, steps per version); MiniLM and recsys at
# their full model sizes (what a restore reads), with small batches so the bench's steps are cheap
WORKLOADS: dict[str, tuple[Callable[..., Iterator[dict]], int, int]] = {
    "minilm-frozen": (lambda every, **kw: w.minilm(12, every=every, frozen=True, batch=2, seq=8, **kw), 12, 4),
    "minilm-full": (lambda every, **kw: w.minilm(12, every=every, batch=2, seq=8, **kw), 12, 4),
    "recsys": (lambda every, **kw: w.recsys(12, every=every, batch=64, **kw), 12, 4),
}
# quick runs: the same runs, tiny; a guard judges a spike once it has seen 20 healthy steps
QUICK: dict[str, tuple[Callable[..., Iterator[dict]], int, int]] = {
    "minilm-frozen": (lambda every, **kw: w.minilm(14, every=every, frozen=True, batch=2, seq=8, tiny=True, **kw), 14, 2),
    "recsys": (lambda every, **kw: w.recsys(14, every=every, rows=20_000, dim=16, batch=64, **kw), 14, 2),
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", nargs="*", default=None, choices=list(WORKLOADS),
                    help="default: all (quick: minilm-frozen and recsys, tiny)")
    ap.add_argument("--blow-up-after", type=int, default=None,
                    help="version after which the LR is multiplied by 1000 (default 8, quick 11)")
    ap.add_argument("--lr-factor", type=float, default=None,
                    help="what the learning rate is multiplied by (default 1000; quick 1e5: tiny models need more to spike)")
    ap.add_argument("--repeats", type=int, default=None, help="measure each recovery this many times (median; default 3, quick 1)")
    ap.add_argument("--record", help="store the results under this key in bench/results/guard_recovery.json")


def _opts(opt: Any) -> list:
    return list(opt.opts.values()) if isinstance(opt, w.Optimizers) else [opt]


def _by_hand_in_process(path: str, model: torch.nn.Module, opt: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    state = torch.load(path, weights_only=True)
    t1 = time.perf_counter()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    t2 = time.perf_counter()
    return {"seconds": t2 - t0, "load_seconds": t1 - t0, "apply_seconds": t2 - t1, "bytes_read": os.path.getsize(path)}


def _by_hand_restart(name: str, path: str, tiny: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.studies.guard_recovery_restart", name, path,
                           "tiny" if tiny else "full"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"},
                          timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"guard_restart {name} failed: {proc.stderr[-2000:]}")
    return {"seconds": wall, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}


def _repeat_rollback(repo: str, vid: str, live: dict, bad: dict, repeats: int, expected: dict) -> dict[str, float]:
    """The guard's restore again from the same diverged state, ``repeats`` times (median): the
    public ``deltackpt.restore`` into the live model and optimizer, on a fresh handle that counts
    what it reads; each checked bit-identical to the target version."""
    import deltackpt

    runs, ok = [], True
    for _ in range(repeats):
        live["model"].load_state_dict(bad["model"])
        live["optimizer"].load_state_dict(w.clone_state(bad["optimizer"]))
        r, cs = open_counted(repo)
        try:
            t0 = time.perf_counter()
            deltackpt.restore(live["model"], r, vid, optimizer=live["optimizer"])
            runs.append({"restore_seconds": time.perf_counter() - t0, "bytes_read": cs.bytes_read_under("packs/")})
        finally:
            r.close()
        got = digests({"model": live["model"].state_dict(), "optimizer": live["optimizer"].state_dict()})
        ok = ok and got == {k: v for k, v in expected.items() if k.startswith(("model/", "optimizer/"))}
    return {**_median(runs), "bit_identical": ok}


def _measure(name: str, repo: Any, rb: Any, target: str, live: dict, bad: dict, repeats: int,
             expected: dict, tiny: bool) -> dict[str, Any]:
    return {"guard": {"check_seconds": rb.check_seconds, "restore_seconds": rb.seconds,
                      "commit_seconds": rb.commit_seconds, "bytes_read": rb.bytes_read,
                      "metadata_bytes": rb.metadata_bytes, "from_step": rb.from_step, "to_step": rb.step,
                      "value": rb.verdict.value},
            "guard_again": _repeat_rollback(repo.location, rb.version.id, live, bad, repeats, expected),
            "by_hand": _median([_by_hand_in_process(target, live["model"], live["optimizer"]) for _ in range(repeats)]),
            "restart": _median([_by_hand_restart(name, target, tiny) for _ in range(repeats)]),
            "file_bytes": os.path.getsize(target),
            "state_bytes": repo.resolve(rb.version.id).logical_bytes}


def run_workload(name: str, work: str, blow_up_after: int, repeats: int, quick: bool = False,
                 lr_factor: float = 1000.0) -> dict[str, Any]:
    """One real run with an LR blow-up; the guard's recovery and both by-hand ones, measured."""
    import deltackpt
    from deltackpt.training import Guard

    make, versions, every = (QUICK if quick else WORKLOADS)[name]
    live: dict = {}
    trace: list = []
    repo = deltackpt.Repo(os.path.join(work, name), create=True)
    try:
        return _run(name, make, every, repo, work, blow_up_after, repeats, live, trace, Guard, quick, lr_factor)
    finally:
        repo.close()


def _run(name, make, every, repo, work, blow_up_after, repeats, live, trace, Guard, tiny, lr_factor) -> dict[str, Any]:
    files: dict[int, str] = {}
    digs: dict[int, dict] = {}
    guard = None
    fed, out = 0, {"workload": name}
    for k, state in enumerate(make(every, live=live, trace=trace)):
        step = state["step"]
        if guard is None:
            guard = Guard(repo, model=live["model"], optimizer=live["optimizer"], watch="loss")
        bad = {"model": w.clone_state(live["model"].state_dict()), "optimizer": w.clone_state(live["optimizer"].state_dict())} \
            if k > blow_up_after and "guard" not in out else None   # the diverged state, to restore from again
        for s, loss, _ in trace[fed:]:   # the losses since the last version, step by step
            t0 = time.perf_counter()
            rb = guard.check(s, {"loss": loss})
            if rb is not None:
                rb.check_seconds = time.perf_counter() - t0
                out.update(_measure(name, repo, rb, files[rb.step], live, bad or {}, repeats, digs[rb.step], tiny))
                break
        fed = len(trace)
        if "guard" in out:
            continue   # the guard restored the state in place; the workload trains on from it
        version = repo.save(state, step=step, metrics={"loss": trace[-1][1]})
        guard.saved(step, version)
        digs[step] = digests(state)
        files[step] = os.path.join(work, f"{name}-{step}.pt")
        torch.save(state, files[step])
        if k == blow_up_after:
            for opt in _opts(live["optimizer"]):
                for g in opt.param_groups:
                    g["lr"] *= lr_factor
    assert guard is not None
    guard.close()
    out["losses"] = {"before": trace[blow_up_after * every][1] if blow_up_after * every < len(trace) else None,
                     "last": trace[-1][1]}
    if "guard" not in out:
        raise SystemExit(f"{name}: the guard never fired (losses {[round(t[1], 3) for t in trace]})")
    return out


def table(rows: list[dict[str, Any]]) -> str:
    mib = lambda n: f"{n / 2 ** 20:.1f} MiB"  # noqa: E731
    lines = ["| workload | state | guard: in the run (restore + commit) | guard: restore again (median) | guard: read | "
             "by hand: torch.load + load_state_dict | by hand: restart (new process) | by hand: read |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, a, h, s = r["guard"], r["guard_again"], r["by_hand"], r["restart"]
        lines.append(f"| {r['workload']} | {mib(r['state_bytes'])} | {g['check_seconds']:.2f} s ({g['restore_seconds']:.2f}"
                     f" + {g['commit_seconds']:.2f}) | {a['restore_seconds']:.2f} s | {mib(g['bytes_read'])} "
                     f"(+{g['metadata_bytes'] / 1024:.0f} KiB index, manifest) | {h['seconds']:.2f} s | "
                     f"{s['seconds']:.2f} s | {mib(h['bytes_read'])} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    names = args.workloads or list(QUICK if args.quick else WORKLOADS)
    blow_up_after = args.blow_up_after if args.blow_up_after is not None else (11 if args.quick else 8)
    repeats = args.repeats or (1 if args.quick else 3)
    rows = []
    with scratch("deltackpt-bench-guard-", parent=args.tmp) as work:
        for name in names:
            lr_factor = args.lr_factor or (1e5 if args.quick else 1000.0)
            rows.append(run_workload(name, work, blow_up_after, repeats, args.quick, lr_factor))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    bad = [r["workload"] for r in rows if not r["guard_again"]["bit_identical"]]
    if bad:
        print(f"NOT BIT-IDENTICAL: {bad}", file=sys.stderr)
        return 1
    if args.record:
        record("guard_recovery", args.record, {"rows": rows, "command": "python -m bench guard_recovery "
                                               + " ".join(sys.argv[2:])})
    return 0
