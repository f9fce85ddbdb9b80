"""Benchmark deltackpt against torch.save, safetensors, HDF5, zstd and ZipNN on real training runs.

    python -m bench.run            # full run, writes bench/RESULTS.md and bench/charts/*.png
    python -m bench.run --quick    # CI: tiny sizes; asserts every system ran and every restore is
                                   # bit-identical, nothing about speed; writes into a temp folder

Timings are wall-clock with a warm page cache.  Systems are interleaved within each version (the
order rotates) because write timings on a shared VM depend on what ran just before.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import xxhash

from bench import report
from bench.systems import Deltackpt, layer_keys, split, systems
from bench.workloads import workloads

HERE = os.path.dirname(os.path.abspath(__file__))


def digests(state) -> dict[str, str]:
    """xxh3-128 of every tensor's bytes (plus dtype/shape), and the non-tensor leaves as text."""
    t, other = split(state)
    out = {}
    for k, v in t.items():
        b = v.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        out[k] = f"{v.dtype}|{tuple(v.shape)}|{xxhash.xxh3_128_hexdigest(memoryview(b))}"
    for k, v in other.items():
        out[k] = repr(v)
    return out


def same(expected: dict[str, str], got, only: list[str] | None = None) -> bool:
    """Every tensor (or only those named) has the expected dtype, shape and bytes; leaves equal."""
    d = got if only is not None else digests(got)
    if only is not None:
        return set(d) == set(only) and all(d[k] == expected[k] for k in only)
    return d == expected


def timed(fn, *a):
    t0 = time.perf_counter()
    r = fn(*a)
    return time.perf_counter() - t0, r


def machine_limits(quick: bool, tmp: str) -> dict[str, float]:
    n = (32 if quick else 512) << 20
    src = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    dst = np.empty_like(src)
    mem = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        mem.append(n / (time.perf_counter() - t0) / 1e9)
    disk = []
    path = os.path.join(tmp, "ddtest")
    for _ in range(3):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(memoryview(src))
            f.flush()
            os.fsync(f.fileno())
        disk.append(n / (time.perf_counter() - t0) / 1e9)
        os.unlink(path)
    return {"memcpy_GBps": statistics.median(mem), "write_fsync_GBps": statistics.median(disk),
            "probe_MB": n / 2**20}


def rss(mode: str, name: str, state_path: str, d: str) -> dict | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "bench.rss", mode, name, state_path, d], capture_output=True,
                       text=True, env=env, timeout=600)
    if p.returncode != 0:
        print(f"  rss {mode} {name} failed: {p.stderr[-500:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def bench_workload(w, syss, tmp: str, repeats: int, rss_names: list[str]) -> dict:
    base = tempfile.mkdtemp(prefix=w.name + "-", dir=tmp)
    res = {s.name: {"bytes": [], "save": [], "load": [], "layer": [], "first_save": [], "ok": []} for s in syss}
    vids: dict[str, list] = {s.name: [] for s in syss if s.versioned}
    first_digest = None
    logical = 0
    t_gen = 0.0
    gen = w.make()
    v = 0
    while True:
        t0 = time.perf_counter()
        try:
            state = next(gen)
        except StopIteration:
            break
        t_gen += time.perf_counter() - t0
        dig = digests(state)
        tens, _ = split(state)
        logical = sum(x.numel() * x.element_size() for x in tens.values())
        lay = layer_keys(tens, w.layer)
        assert lay, f"{w.name}: layer {w.layer} matches nothing"
        if first_digest is None:
            first_digest = dig
        order = syss[v % len(syss):] + syss[:v % len(syss)]
        for s in order:   # save, interleaved
            d = os.path.join(base, s.name) if s.versioned else os.path.join(base, s.name, f"v{v}")
            dt, n = timed(s.save, state, d)
            r = res[s.name]
            r["bytes"].append(n)
            r["save"].append(dt)
            if s.versioned:
                import deltackpt
                vids[s.name].append(deltackpt.Repo(d).log()[-1].id)
        if v == 0:   # extra first-save repeats into fresh folders
            for rep in range(repeats - 1):
                for s in order[rep % len(order):] + order[:rep % len(order)]:
                    d = os.path.join(base, "scratch", f"{s.name}-{rep}")
                    dt, _ = timed(s.save, state, d)
                    res[s.name]["first_save"].append(dt)
                    if s.versioned:
                        import deltackpt
                        deltackpt.Repo(d).close()
                    shutil.rmtree(d)
            for s in syss:
                res[s.name]["first_save"].append(res[s.name]["save"][0])
        del state, tens
        for s in order:   # full load + one-layer load of the version just saved, interleaved
            d = os.path.join(base, s.name) if s.versioned else os.path.join(base, s.name, f"v{v}")
            dt, got = timed(s.load, d)
            res[s.name]["load"].append(dt)
            ok = same(dig, got) if s.lossless else True
            del got
            dt, got = timed(s.load_layer, d, w.layer)
            res[s.name]["layer"].append(dt)
            ok_l = same(dig, digests(got), lay) if s.lossless or v == 0 else True
            res[s.name]["ok"].append(bool(ok and ok_l))
            del got
        print(f"  {w.name} v{v}: " + ", ".join(f"{s.name} {res[s.name]['save'][-1]:.2f}s" for s in syss), flush=True)
        v += 1
    for s in syss:   # rollback to the oldest version
        r = res[s.name]
        if s.versioned:
            d = os.path.join(base, s.name)
            dt, got = timed(s.load, d, vids[s.name][0])
        else:
            dt, got = timed(s.load, os.path.join(base, s.name, "v0"))
        r["rollback"] = dt
        if s.lossless:
            r["ok"].append(same(first_digest, got))
        del got
    # bytes a deltackpt layer restore reads
    import deltackpt
    from deltackpt.store import LocalStore
    from deltackpt.store.counting import CountingStore
    cs = CountingStore(LocalStore(os.path.join(base, "deltackpt")))
    rp = deltackpt.Repo(cs)
    rp.load(layers=[f"model.{w.layer}"])
    layer_read = cs.bytes_read
    cs.reset()
    rp.load()
    full_read = cs.bytes_read
    rp.close()
    out = {"workload": w.name, "versions": v, "logical_bytes": logical, "train_s": t_gen, "layer": w.layer,
           "layer_bytes_read": layer_read, "full_bytes_read": full_read, "systems": res, "rss": {}}
    last_pt = os.path.join(base, "torch.save", f"v{v - 1}", "ckpt.pt")
    for name in rss_names:
        sv = rss("save", name, last_pt, os.path.join(base, "rss-" + name))
        ld = rss("load", name, last_pt, os.path.join(base, "rss-" + name))
        out["rss"][name] = {"save": sv, "load": ld}
        shutil.rmtree(os.path.join(base, "rss-" + name), ignore_errors=True)
    for s in syss:
        if s.versioned:
            deltackpt.Repo(os.path.join(base, s.name)).close()
    shutil.rmtree(base, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny CI run: checks, no speed claims")
    ap.add_argument("--scale", action="store_true", help="add the >= 2 GB scale workload (untested, needs ~8 GB)")
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--repeats", type=int, default=None, help="first-save repeats (default 3, quick 2)")
    ap.add_argument("--tmp", default=os.environ.get("BENCH_TMP"), help="scratch folder (default: system temp)")
    ap.add_argument("--out", default=None, help="where RESULTS.md and charts/ go (default: bench/, quick: temp)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="deltackpt-bench-", dir=a.tmp)
    out_dir = a.out or (os.path.join(tmp, "out") if a.quick else HERE)
    repeats = a.repeats or (2 if a.quick else 3)
    try:
        limits = machine_limits(a.quick, tmp)
        print(f"machine: {limits}", flush=True)
        results = []
        for w in workloads(a.quick, a.scale):
            if a.only and w.name not in a.only:
                continue
            syss = systems(scale=w.name == "scale")
            if a.quick:
                rss_names = ["deltackpt", "torch.save"] if w.name == "minilm-frozen" else []
            else:
                rss_names = [s.name for s in syss] if w.name in ("minilm-frozen", "scale") else ["deltackpt", "torch.save"]
            print(f"workload {w.name}", flush=True)
            results.append(bench_workload(w, syss, tmp, 1 if w.name == "scale" else repeats, rss_names))
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench.run" + (" --quick" if a.quick else "") + (f" --only {' '.join(a.only)}" if a.only else ""),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}",
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "limits": limits, "wall_s": time.perf_counter() - t_start,
            "quick": a.quick,
        }
        bad = [(r["workload"], n) for r in results for n, x in r["systems"].items() if not all(x["ok"]) or not x["bytes"]]
        ran = {n for r in results for n in r["systems"] if r["systems"][n]["bytes"]}
        report.write(out_dir, results, meta)
        print(f"wrote {out_dir}/RESULTS.md in {meta['wall_s']:.0f} s", flush=True)
        if bad:
            print(f"NOT BIT-IDENTICAL: {bad}", file=sys.stderr)
            return 1
        if a.quick:
            want = {s.name for s in systems()}
            assert want <= ran, f"systems that did not run: {want - ran}"
            assert all(r["rss"].get(n, {}).get("save") and r["rss"][n].get("load") for r in results for n in r["rss"]), "rss child failed"
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
