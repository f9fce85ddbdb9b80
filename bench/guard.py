"""Recovery from a divergence: the guard's in-place rollback against the by-hand alternative
(stop, ``torch.load`` the last good file, restart), measured in the same run.

Each workload of bench/workloads.py trains for real; every ``every`` steps its state is saved twice,
into a deltackpt repository and as a ``torch.save`` file (what a team restarting by hand would
load).  After version ``--blow-up-after`` the learning rate is multiplied by 1000 (a schedule bug):
the loss spikes, the guard fed every step's loss fires and rolls model and optimizer back in place
to the newest sound version, then training goes on.  At that moment, for the same target version:

* guard: wall time of the ``check`` that fired (restore + committing the restored state + the
  event record), the restore alone, and the bytes of chunk objects it read (plus index and
  manifest bytes);
* by hand, in process: ``torch.load`` of that version's file and ``load_state_dict`` into the
  live model and optimizer; bytes read = the file's size;
* by hand, restart: a fresh Python process (bench/guard_restart.py) that imports torch, builds the
  model and optimizer and loads the file: the wall time from its start to ready.

Files were just written, so both read from the page cache.

    PYTHONPATH=. python bench/guard.py                      # all workloads, prints a table
    PYTHONPATH=. python bench/guard.py --record main        # and stores it in bench/results/guard.json
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

from bench import workloads as w
from bench.record import record
from bench.scratch import scratch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name -> (generator factory taking live/trace, versions, steps per version); MiniLM and recsys at
# their full model sizes (what a restore reads), with small batches so the bench's steps are cheap
WORKLOADS: dict[str, tuple[Callable[..., Iterator[dict]], int, int]] = {
    "minilm-frozen": (lambda every, **kw: w.minilm(12, every=every, frozen=True, batch=2, seq=8, **kw), 12, 4),
    "minilm-full": (lambda every, **kw: w.minilm(12, every=every, batch=2, seq=8, **kw), 12, 4),
    "recsys": (lambda every, **kw: w.recsys(12, every=every, batch=64, **kw), 12, 4),
}


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


def _by_hand_restart(name: str, path: str) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.guard_restart", name, path], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"guard_restart {name} failed: {proc.stderr[-2000:]}")
    return {"seconds": wall, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}


def _repeat_rollback(repo: str, vid: str, live: dict, bad: dict, repeats: int) -> dict[str, float]:
    """The guard's restore again from the same diverged state, ``repeats`` times (median)."""
    import deltackpt
    from deltackpt.training.rollback import Parts, roll_back

    runs = []
    for _ in range(repeats):
        live["model"].load_state_dict(bad["model"])
        live["optimizer"].load_state_dict(w._clone(bad["optimizer"]))
        done = roll_back(deltackpt.Repo(repo).core, vid, Parts(live["model"], live["optimizer"], restore_rng=False))
        runs.append({"restore_seconds": done.seconds, "bytes_read": done.bytes_read})
    return _median(runs)


def _measure(name: str, repo: str, rb: Any, target: str, live: dict, bad: dict, repeats: int) -> dict[str, Any]:
    import deltackpt

    return {"guard": {"check_seconds": rb.check_seconds, "restore_seconds": rb.seconds,
                      "commit_seconds": rb.commit_seconds, "bytes_read": rb.bytes_read,
                      "metadata_bytes": rb.metadata_bytes, "from_step": rb.from_step, "to_step": rb.step,
                      "value": rb.verdict.value},
            "guard_again": _repeat_rollback(repo, rb.version.id, live, bad, repeats),
            "by_hand": _median([_by_hand_in_process(target, live["model"], live["optimizer"]) for _ in range(repeats)]),
            "restart": _median([_by_hand_restart(name, target) for _ in range(repeats)]),
            "file_bytes": os.path.getsize(target),
            "state_bytes": deltackpt.Repo(repo).resolve(rb.version.id).logical_bytes}


def run_workload(name: str, work: str, blow_up_after: int, repeats: int) -> dict[str, Any]:
    """One real run with an LR blow-up; the guard's recovery and both by-hand ones, measured."""
    from deltackpt.training import Guard
    import deltackpt

    make, versions, every = WORKLOADS[name]
    live: dict = {}
    trace: list = []
    repo = os.path.join(work, name)
    files: dict[int, str] = {}
    guard: Guard | None = None
    fed, out = 0, {"workload": name}
    for k, state in enumerate(make(every, live=live, trace=trace)):
        step = state["step"]
        if guard is None:
            guard = Guard(repo, model=live["model"], optimizer=live["optimizer"], watch="loss")
        bad = {"model": w._clone(live["model"].state_dict()), "optimizer": w._clone(live["optimizer"].state_dict())} \
            if k > blow_up_after and "guard" not in out else None   # the diverged state, to restore from again
        for s, loss, _ in trace[fed:]:   # the losses since the last version, step by step
            t0 = time.perf_counter()
            rb = guard.check(s, {"loss": loss})
            if rb is not None:
                rb.check_seconds = time.perf_counter() - t0
                out.update(_measure(name, repo, rb, files[rb.step], live, bad or {}, repeats))
                break
        fed = len(trace)
        if "guard" in out:
            continue   # the guard restored the state in place; the workload trains on from it
        version = deltackpt.save(state, repo, step=step, metrics={"loss": trace[-1][1]})
        guard.saved(step, version)
        files[step] = os.path.join(work, f"{name}-{step}.pt")
        torch.save(state, files[step])
        if k == blow_up_after:
            for opt in _opts(live["optimizer"]):
                for g in opt.param_groups:
                    g["lr"] *= 1000.0
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--blow-up-after", type=int, default=8, help="version after which the LR is multiplied by 1000")
    ap.add_argument("--repeats", type=int, default=3, help="measure each recovery this many times (median)")
    ap.add_argument("--record", help="store the results under this key in bench/results/guard.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    rows = []
    with scratch("deltackpt-bench-guard-") as work:
        for name in args.workloads:
            rows.append(run_workload(name, work, args.blow_up_after, args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if args.record:
        record("guard", args.record, {"rows": rows, "command": "PYTHONPATH=. python bench/guard.py "
                                      + " ".join(argv if argv is not None else sys.argv[1:])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
