"""What a save costs as the history grows: every version kept, saved through one ``Repo``.

A save's maintenance step plans over every kept version (deltify_plan.py), so its cost is the one
part of a save that can grow with the history.  This saves ``--versions`` versions of two small
states and reports, per band of versions, a save's CPU (all threads) and the maintenance step's
seconds (``repo.session.last_maintenance``), the handle's resident memory (VmRSS) and the bytes
stored and written; then the restart: the newest version loaded by a fresh process, files in the
page cache, against ``torch.load`` of the same state (a long history's index is what a restart
reads before anything else: format 3 searches it instead of decoding every entry):

* dense: an 8-layer MLP of 256 x 256 and its AdamW moments (4 MB), one optimizer step between
  versions: every chunk changes, every old keyframe stays whole;
* sparse: an embedding table of 4096 x 64 (1 MB) with 20 rows nudged between versions: every
  period of forward deltas is a candidate for re-storing.

The last band's median against the first band's is the figure (flat means about 1; before stop
35 the dense run went from 3 ms to 4 s of maintenance per save over 300 versions).  The newest
version is checked bit-identical at the end.  Last, the listing of the whole history (``Repo.log()``,
what ``deltackpt log`` prints) and of its newest ten (``log(limit=10)``, ``deltackpt log -n 10``),
each in a fresh process, files in the page cache.

    python -m bench history_growth                  # 300 versions each
    python -m bench history_growth --quick          # 30 versions: CI
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

import torch

from bench.common.measure import digests, proc_io, same, timed_cpu
from bench.common.memory import vm_rss
from bench.common.record import record
from bench.common.scratch import scratch

SUMMARY = ("a save's CPU and its maintenance step's seconds as every version of a run is kept (dense and sparse "
           "states), then the newest version's restart in a fresh process against torch.load")
WRITES = "stdout; --record KEY: bench/results/history_growth.json"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--versions", type=int, default=None, help="versions per run (default 300, quick 30)")
    ap.add_argument("--record", help="store the results under this key")


def _dense():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> dict:
        model(torch.randn(4, 256)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}
    return step


def _sparse():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(4096, 64, generator=g)

    def step() -> dict:
        table[torch.randint(0, 4096, (20,), generator=g)] += 0.01
        return {"emb": table}
    return step


# a fresh process: modules imported, every file read once (page cache), then the timed load
_RESTART = """
import json, sys, time
import torch
from bench.common import coldcache
from bench.studies.load_speed import _import_load_modules
import deltackpt
_import_load_modules()
path, pt, first = sys.argv[1:4]
coldcache.warm(coldcache.files_under(path, pt))
out = {}
for system in (("deltackpt", "torch") if first == "deltackpt" else ("torch", "deltackpt")):
    t = time.perf_counter()
    deltackpt.load(path) if system == "deltackpt" else torch.load(pt, weights_only=True)
    out[system] = time.perf_counter() - t
print(json.dumps(out))
"""


def _restart(path: str, state: dict, rounds: int = 3) -> dict[str, Any]:
    """Seconds to load the newest version in a fresh process, and ``torch.load``'s of the same
    state in that process, the order alternating; medians of ``rounds``."""
    import torch
    pt = path + ".pt"
    torch.save(state, pt)
    try:
        runs = []
        for k in range(rounds):
            got = subprocess.run([sys.executable, "-c", _RESTART, path, pt, ("deltackpt", "torch")[k % 2]],
                                 capture_output=True, text=True, check=True,
                                 cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
            runs.append(json.loads(got.stdout.strip().splitlines()[-1]))
    finally:
        os.unlink(pt)
    index = sum(os.path.getsize(os.path.join(path, "index", f)) for f in os.listdir(os.path.join(path, "index")))
    return {"deltackpt": statistics.median(r["deltackpt"] for r in runs),
            "torch": statistics.median(r["torch"] for r in runs), "runs": runs, "index_bytes": index}


_LISTING = """
import json, sys, time
import torch
import deltackpt
deltackpt.Repo   # the package imports its modules when first used (~0.2 s): apart from the listing
path, limit = sys.argv[1], int(sys.argv[2]) or None
t = time.perf_counter()
with deltackpt.Repo(path) as repo:
    n = len(repo.log(limit=limit))
print(json.dumps({"seconds": time.perf_counter() - t, "listed": n}))
"""


def _listing(path: str, rounds: int = 3) -> dict[str, Any]:
    """Seconds to open the repository and list its whole history, and its newest ten, in a fresh
    process each (medians of ``rounds``), and the bytes of its manifests."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out: dict[str, Any] = {}
    for name, limit in (("all", 0), ("newest_10", 10)):
        runs = [json.loads(subprocess.run([sys.executable, "-c", _LISTING, path, str(limit)], capture_output=True,
                                          text=True, check=True, cwd=root).stdout.strip().splitlines()[-1])
                for _ in range(rounds)]
        out[name] = statistics.median(r["seconds"] for r in runs)
    folder = os.path.join(path, "manifests")
    out["manifest_bytes"] = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    return out


def _run(make, versions: int, path: str) -> dict[str, Any]:
    import deltackpt
    step = make()
    cpu, maint, rss = [], [], []
    band = max(1, versions // 10)
    written0 = proc_io("wchar")
    with deltackpt.Repo(path, create=True) as repo:
        for v in range(versions):
            state = step()
            _wall, c, _v = timed_cpu(lambda: repo.save(state, step=v))
            cpu.append(c)
            m = repo.session.last_maintenance
            maint.append(getattr(m, "seconds", 0.0))
            rss.append(vm_rss())
        ok = same(digests(state), repo.load())
    written = proc_io("wchar") - written0
    stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    first, last = slice(1, 1 + band), slice(versions - band, versions)
    return {"cpu": cpu, "maintenance": maint, "ok": ok, "stored": stored, "written": written,
            "restart": _restart(path, state), "listing": _listing(path),
            # what the process holds more at the end than after the first tenth of the saves
            "rss_growth": rss[-1] - rss[band],
            "cpu_first": statistics.median(cpu[first]), "cpu_last": statistics.median(cpu[last]),
            "maintenance_first": statistics.median(maint[first]), "maintenance_last": statistics.median(maint[last])}


def run(args: argparse.Namespace) -> int:
    versions = args.versions or (30 if args.quick else 300)
    results: dict[str, Any] = {"versions": versions, "runs": {}}
    with scratch("deltackpt-bench-history-", parent=args.tmp) as work:
        for name, make in (("dense", _dense), ("sparse", _sparse)):
            r = _run(make, versions, os.path.join(work, name))
            results["runs"][name] = r
            assert r["ok"], name
    print(f"\n{versions} versions, one Repo, every version kept; medians over the first and the last tenth of the saves\n")
    print("| state | CPU per save, first -> last (ms) | maintenance step, first -> last (ms) | last / first (CPU) "
          "| resident memory, growth after the first tenth (MiB) | stored (MiB) | written (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results["runs"].items():
        print(f"| {name} | {1e3 * r['cpu_first']:.1f} -> {1e3 * r['cpu_last']:.1f} | "
              f"{1e3 * r['maintenance_first']:.1f} -> {1e3 * r['maintenance_last']:.1f} | "
              f"{r['cpu_last'] / max(r['cpu_first'], 1e-6):.2f} | {r['rss_growth'] / 2**20:.1f} | "
              f"{r['stored'] / 2**20:.1f} | {r['written'] / 2**20:.1f} |")
    print("\nThe newest version loaded by a fresh process (page cache), medians of 3, against torch.load in "
          "the same process\n")
    print("| state | deltackpt.load (ms) | torch.load (ms) | ratio | index files (KiB) |")
    print("|---|---|---|---|---|")
    for name, r in results["runs"].items():
        x = r["restart"]
        print(f"| {name} | {1e3 * x['deltackpt']:.1f} | {1e3 * x['torch']:.1f} | "
              f"{x['deltackpt'] / max(x['torch'], 1e-9):.2f}x | {x['index_bytes'] / 1024:.0f} |")
    print("\nThe history listed by a fresh process (open + Repo.log(), modules imported, page cache), medians of 3\n")
    print("| state | every version (ms) | newest 10 (ms) | manifests (KiB) |")
    print("|---|---|---|---|")
    for name, r in results["runs"].items():
        x = r["listing"]
        print(f"| {name} | {1e3 * x['all']:.1f} | {1e3 * x['newest_10']:.1f} | {x['manifest_bytes'] / 1024:.0f} |")
    if args.record and not args.quick:
        record("history_growth", args.record, results)
    return 0
