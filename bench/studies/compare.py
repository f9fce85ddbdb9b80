"""The whole-run comparison behind bench/RESULTS.md: real training runs, every version saved and read
back by every checkpoint system (torch.save with and without fsync, safetensors, DCP in one process,
HDF5 plain / gzip / lzf, zstd, ZipNN, deltackpt lossless and q8), interleaved.

    python -m bench compare                       # full run: bench/RESULTS.md, results/compare.json, charts/
    python -m bench compare --quick               # CI: tiny sizes, checks only, into a scratch folder
    python -m bench compare --only gpt2-adamw gpt2-bf16-weights --cache /data/bench-cache
    python -m bench compare --only minilm-full --systems deltackpt torch.save --out /tmp/r

Per version and system: bytes stored and written, wall and CPU seconds of the save, memory the
system keeps after its save returns, a full load warm (just after the saves) and cold (the system's
files dropped from the page cache, bench/common/coldcache.py), and one layer warm and cold.  Systems
take turns within each version (the order rotates) because write timings on a shared machine
depend on what ran just before; a ratio to torch.save is taken within each version and the median
is reported.  After the last version: the newest version loaded by a fresh process (the restart
after a crash; the system's package imported before the clock, what its first load imports inside
it; deltackpt run from compiled bytecode as an install leaves it, bench/common/bytecode.py) with
the files in the page cache and without them, the
live rollback by one version for each system that can do one, deltackpt's rollback rows and its
restore throughput by read threads, and peak memory of a save and a load in a child process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from bench.common import coldcache
from bench.common.bytecode import compiled
from bench.common.measure import digests, machine_limits, same, tensor_bytes, timed, timed_cpu
from bench.common.memory import settled_rss
from bench.common.repo_internals import open_counted
from bench.common.scratch import scratch
from bench.common.systems import folder_bytes, layer_keys, split, systems
from bench.common.workloads import workloads
from bench.studies import compare_read_threads, compare_report, compare_rollback

SUMMARY = ("every checkpoint system saves and reloads each version of real training runs (MiniLM, recsys, "
           "GPT-2 fp32+AdamW and bf16 weights): bytes, save wall/CPU, memory kept, warm/cold/fresh-process "
           "loads, one layer, rollback")
WRITES = "bench/RESULTS.md, bench/results/compare.json, bench/charts/ (quick: a scratch folder)"

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(HERE)
KEYS = ("bytes", "save", "cpu", "written", "kept", "load", "load_cold", "read", "io_read", "touch_read", "resident",
        "layer", "layer_cold", "layer_read", "first_save", "ok")


def default_cache() -> str:
    """Where trained versions are kept between runs unless ``--cache`` says otherwise."""
    return os.environ.get("DELTACKPT_BENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "deltackpt-bench")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--systems", nargs="*", help="system names to run (deltackpt and torch.save always run)")
    ap.add_argument("--delta-base", default=None, help="config delta_base of deltackpt's repositories (default: the library's)")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    ap.add_argument("--threads", default="1,2", help="read-pool sizes for the restore throughput table ('' skips it)")
    ap.add_argument("--repeats", type=int, default=None, help="first-save repeats (default 3, quick 2)")
    ap.add_argument("--rollback-repeats", type=int, default=None,
                    help="runs of each rollback row, read-threads child and fresh-process load (median; default 3, quick 1)")
    ap.add_argument("--cache", default=None,
                    help="keep the GPT-2 run's trained versions here, so that a second run loads them instead of "
                         "training (~7 GB; default: $DELTACKPT_BENCH_CACHE, else ~/.cache/deltackpt-bench; quick: none)")
    ap.add_argument("--out", default=None, help="where RESULTS.md, compare.json and charts/ go (default: bench/, quick: scratch)")


def _dir(base: str, s, v: int) -> str:
    return os.path.join(base, s.name) if s.versioned else os.path.join(base, s.name, f"v{v}")


def _cold_load(s, base: str, d: str, vid: str | None, dig: dict) -> dict:
    """A cold full load: deltackpt through a fresh counting handle (bytes the store fetched), the
    others through their loader (bytes that reached the disk, and those the first touch of every
    tensor adds: safetensors maps the file and reads on touch)."""
    if s.versioned:
        row = compare_rollback.cold_load(d, vid, dig)
        return {"s": row["s"], "read": row["store_read"], "io_read": row["io_read"], "touch_read": 0,
                "resident": row["resident_after_drop"], "ok": row["ok"] or not s.lossless}
    dt, got, io = coldcache.cold(s.load, coldcache.files_under(os.path.join(base, s.name)), d)
    r0 = coldcache.io_read_bytes()
    ok = same(dig, got) if s.lossless else True
    touch = coldcache.io_read_bytes() - r0
    return {"s": dt, "read": io["io_read"], "io_read": io["io_read"], "touch_read": touch,
            "resident": io["resident_after_drop"], "ok": ok}


def _cold_layer(s, d: str, layer: str, vid: str | None) -> tuple[float, int, dict]:
    """One layer read cold: (seconds, bytes read, the tensors); deltackpt on a fresh counting
    handle (bytes its store fetched), the others bytes from disk."""
    files = coldcache.files_under(d)
    if not s.versioned:
        dt, got, io = coldcache.cold(s.load_layer, files, d, layer)
        return dt, io["io_read"], got
    holder: dict = {}

    def go():
        r, cs = open_counted(d)
        try:
            t, _ = split(r.load(vid, layers=[f"model.{layer}"]))
        finally:
            r.close()
        holder["read"] = cs.bytes_read
        return t
    dt, got, _ = coldcache.cold(go, files)
    return dt, holder["read"], got


class _Run:
    """One workload's figures as they accumulate: per system, per version."""

    def __init__(self, syss) -> None:
        self.res = {s.name: {k: [] for k in KEYS} for s in syss}
        self.vids: dict[str, list] = {s.name: [] for s in syss if s.versioned}
        self.digs: list[dict] = []


def _save_all(run: _Run, order, state, base: str, v: int) -> None:
    for s in order:   # save, interleaved
        d = _dir(base, s, v)
        rss0 = settled_rss()
        dt, cpu, n = timed_cpu(s.save, state, d)
        r = run.res[s.name]
        # memory the system still holds once its save returned, summed over its saves (what other
        # systems do between them is outside these windows)
        r["kept"].append((r["kept"][-1] if r["kept"] else 0) + settled_rss() - rss0)
        r["bytes"].append(n)
        r["save"].append(dt)
        r["cpu"].append(cpu)
        if s.versioned:
            run.vids[s.name].append(s.last.id)
            r["written"].append(s.last.written_bytes)
        else:
            r["written"].append(folder_bytes(d))


def _first_saves(run: _Run, syss, order, state, base: str, repeats: int) -> None:
    """Extra first-save repeats into fresh folders (removed at once), beside the first version's save."""
    for rep in range(repeats - 1):
        for s in order[rep % len(order):] + order[:rep % len(order)]:
            d = os.path.join(base, "scratch", f"{s.name}-{rep}")
            dt, _ = timed(s.save, state, d)
            run.res[s.name]["first_save"].append(dt)
            s.release(d)
            shutil.rmtree(d)
    for s in syss:
        run.res[s.name]["first_save"].append(run.res[s.name]["save"][0])


def _load_all(run: _Run, order, base: str, v: int, dig: dict, lay: list[str], layer: str) -> None:
    for s in order:   # warm full load, cold full load, one layer warm and cold, of the version just saved
        d, r = _dir(base, s, v), run.res[s.name]
        vid = run.vids[s.name][-1] if s.versioned else None
        dt, got = timed(s.load, d)
        r["load"].append(dt)
        ok = same(dig, got) if s.lossless else True
        del got
        c = _cold_load(s, base, d, vid, dig)
        for k in ("read", "io_read", "touch_read", "resident"):
            r[k].append(c[k])
        r["load_cold"].append(c["s"])
        dt, got = timed(s.load_layer, d, layer)
        r["layer"].append(dt)
        ok_l = same(dig, digests(got), lay) if s.lossless or v == 0 else True
        del got
        dt, nread, got = _cold_layer(s, d, layer, vid)
        r["layer_cold"].append(dt)
        r["layer_read"].append(nread)
        ok_l = ok_l and (same(dig, digests(got), lay) if s.lossless or v == 0 else True)
        r["ok"].append(bool(ok and ok_l and c["ok"]))
        del got


def _versions(w, syss, base: str, repeats: int, live: dict, run: _Run) -> tuple[int, int, float]:
    """Train the workload; every system saves and loads each version.  Returns (versions, logical
    bytes, training seconds)."""
    logical, t_gen, v = 0, 0.0, 0
    gen = w.make(live=live)
    while True:
        t0 = time.perf_counter()
        try:
            state = next(gen)
        except StopIteration:
            return v, logical, t_gen
        t_gen += time.perf_counter() - t0
        dig = digests(state)
        run.digs.append(dig)
        tens, _ = split(state)
        logical = tensor_bytes(state)
        lay = layer_keys(tens, w.layer)
        assert lay, f"{w.name}: layer {w.layer} matches nothing"
        order = syss[v % len(syss):] + syss[:v % len(syss)]
        _save_all(run, order, state, base, v)
        if v == 0:
            _first_saves(run, syss, order, state, base, repeats)
        del state, tens
        coldcache.sync(coldcache.files_under(base))   # no kernel writeback of an unsynced save during the loads
        _load_all(run, order, base, v, dig, lay, w.layer)
        print(f"  {w.name} v{v}: " + ", ".join(f"{s.name} {run.res[s.name]['save'][-1]:.2f}s" for s in syss), flush=True)
        v += 1


def _rollback_oldest(run: _Run, syss, base: str) -> None:
    for s in syss:   # rollback to the oldest version (warm)
        r = run.res[s.name]
        dt, got = timed(s.load, _dir(base, s, 0), run.vids[s.name][0]) if s.versioned else timed(s.load, _dir(base, s, 0))
        r["rollback"] = dt
        if s.lossless:
            r["ok"].append(same(run.digs[0], got))
        del got


def _bytes_read(repo: str, layer: str) -> tuple[int, int]:
    """Bytes a deltackpt one-layer restore and a full load read, each on a fresh handle."""
    rp, cs = open_counted(repo)
    rp.load(layers=[f"model.{layer}"])
    layer_read = cs.bytes_read
    rp.close()
    rp, cs = open_counted(repo)
    rp.load()
    full_read = cs.bytes_read
    rp.close()
    return layer_read, full_read


def _child(*args: str) -> dict | None:
    """Run ``python -m bench.studies.compare_children ARGS``; its last line of output, as JSON."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "bench.studies.compare_children", *args], capture_output=True,
                       text=True, env=env, timeout=1800)
    if p.returncode != 0:
        print(f"  child {' '.join(args[:2])} failed: {p.stderr[-800:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def _fresh_loads(syss, base: str, v: int, dig: dict, rounds: int, one_child: bool = False) -> dict:
    """The newest version loaded by a fresh process per system, with its files in the page cache
    (warm) and dropped from it (cold); ``rounds`` rounds, the systems in turn in each.
    ``one_child``: every system in one child per mode (quick runs: each child costs seconds of
    imports), so only the first load is a fresh process's."""
    out: dict = {s.name: {"warm": [], "cold": [], "io_read": [], "ok": True} for s in syss}
    for k in range(rounds):
        order = syss[k % len(syss):] + syss[:k % len(syss)]
        for group in ([order] if one_child else [[s] for s in order]):
            for mode in ("warm", "cold"):
                dirs = [(s, _dir(base, s, v)) for s in group]
                if mode == "warm":
                    coldcache.warm(coldcache.files_under(*[d for _, d in dirs]))
                res = _child("load", *(["--cold"] if mode == "cold" else []), *[x for s, d in dirs for x in (s.name, d)])
                for s, _ in dirs:
                    x, got = out[s.name], (res or {}).get(s.name)
                    if got is None:
                        x["ok"] = False
                        continue
                    x[mode].append(got["s"])
                    if mode == "cold":
                        x["io_read"].append(got["io_read"])
                    x["ok"] = x["ok"] and (got["digests"] == dig or not s.lossless)
    return out


def _rss_rows(rss_names: list[str], base: str, v: int) -> dict:
    """Peak RSS of a save and a load per system, each in a child process whose files go under
    ``base`` (removed by the caller even where a child was killed)."""
    out = {}
    last_pt = os.path.join(base, "torch.save", f"v{v - 1}", "ckpt.pt")
    for name in rss_names:
        d = os.path.join(base, "rss-" + name)
        out[name] = {"save": _child("rss-save", name, last_pt, d), "load": _child("rss-load", name, last_pt, d)}
        shutil.rmtree(d, ignore_errors=True)
    return out


def bench_workload(w, syss, tmp: str, repeats: int, rss_names: list[str], threads: list[int],
                   rb_repeats: int = 1, fresh: str = "per system") -> dict:
    """Every figure of one workload; its files go under a folder of ``tmp``, removed before returning.
    ``fresh``: "per system" (a fresh process per load), "one child" (one per mode) or "" (none)."""
    base = tempfile.mkdtemp(prefix=w.name + "-", dir=tmp)
    try:
        run, live = _Run(syss), {}
        v, logical, t_gen = _versions(w, syss, base, repeats, live, run)
        _rollback_oldest(run, syss, base)
        repo = os.path.join(base, "deltackpt")
        ts = run.res.get("torch.save")
        rb = compare_rollback.rows(repo, run.digs, live, ts["bytes"] if ts else [0] * v,
                                   ts["load_cold"] if ts else [float("nan")] * v, rb_repeats)
        print(f"  {w.name} rollback: " + ", ".join(f"{x['row']} {x['s']:.3f}s" for x in rb["rows"]), flush=True)
        live_rb = compare_rollback.every_system(syss, base, live, run.digs, lambda s, k: _dir(base, s, k))
        thr = compare_read_threads.measure(repo, threads, run.digs[-1], logical, rb_repeats) if threads else None
        layer_read, full_read = _bytes_read(repo, w.layer)
        fresh_rows = _fresh_loads(syss, base, v - 1, run.digs[-1], rb_repeats, one_child=fresh == "one child") \
            if fresh else {}
        out = {"workload": w.name, "versions": v, "logical_bytes": logical, "train_s": t_gen, "layer": w.layer,
               "layer_bytes_read": layer_read, "full_bytes_read": full_read, "systems": run.res, "rss": {},
               "rollback": rb, "live_rollback": live_rb, "fresh": fresh_rows, "read_threads": thr}
        out["rss"] = _rss_rows(rss_names, base, v)
        return out
    finally:
        for s in syss:
            s.close()
        shutil.rmtree(base, ignore_errors=True)


def failures(results: list[dict]) -> list[tuple]:
    """Every (workload, row) whose restore was not bit-identical, or a system that saved nothing."""
    bad = [(r["workload"], n) for r in results for n, x in r["systems"].items() if not all(x["ok"]) or not x["bytes"]]
    bad += [(r["workload"], x["row"]) for r in results for x in r["rollback"]["rows"] if not x["ok"]]
    bad += [(r["workload"], f"live rollback {n}") for r in results for n, x in r["live_rollback"].items() if not x["ok"]]
    bad += [(r["workload"], f"fresh-process load {n}") for r in results for n, x in r["fresh"].items() if not x["ok"]]
    bad += [(r["workload"], f"read threads {x['threads']}") for r in results
            for x in (r["read_threads"] or {}).get("rows", []) if not x["ok"]]
    return bad


def _workloads(a: argparse.Namespace, tmp: str) -> list[dict]:
    repeats = a.repeats or (2 if a.quick else 3)
    threads = [int(x) for x in a.threads.split(",") if x]
    rb_repeats = a.rollback_repeats or (1 if a.quick else 3)
    results = []
    for w in workloads(a.quick, None if a.quick else (a.cache or default_cache())):
        if a.only and w.name not in a.only:
            continue
        wanted = None if not a.systems else set(a.systems) | {"deltackpt", "torch.save"}
        syss = [s for s in systems(w.systems, a.delta_base) if wanted is None or s.name in wanted]
        if a.quick:   # one workload pays for the fewest child processes: each imports torch, seconds apiece
            rss_names = ["deltackpt"] if w.name == "gpt2-adamw" else []
            thr = threads[:1] if w.name == "gpt2-adamw" else []
            fresh = "one child" if w.name == "gpt2-adamw" else ""
        else:
            rss_names = [s.name for s in syss] if w.name in ("minilm-frozen", "gpt2-adamw") else ["deltackpt", "torch.save"]
            thr, fresh = threads, "per system"
        rss_names = [] if a.no_rss else rss_names
        print(f"workload {w.name}", flush=True)
        results.append(bench_workload(w, syss, tmp, repeats, rss_names, thr, rb_repeats, fresh))
    return results


def _check_quick(a: argparse.Namespace, results: list[dict], probe: dict) -> None:
    """CI's checks: every system ran, every row is there; nothing about speed."""
    ran = {n for r in results for n in r["systems"] if r["systems"][n]["bytes"]}
    want = {s.name for s in systems()} if not a.systems and not a.only else set()
    assert want <= ran, f"systems that did not run: {want - ran}"
    assert all(r["rss"].get(n, {}).get("save") and r["rss"][n].get("load") for r in results for n in r["rss"]), "rss child failed"
    assert all(len(r["systems"][n]["load_cold"]) == r["versions"] for r in results for n in r["systems"]), "a cold load is missing"
    assert all(len(r["rollback"]["rows"]) >= 5 for r in results if r["workload"] != "gpt2-bf16-weights"), "rollback rows missing"
    assert all({"deltackpt", "dcp"} <= set(r["live_rollback"]) for r in results
               if "dcp" in r["systems"]), "a live rollback row is missing"
    fresh = [r["fresh"] for r in results if r["workload"] == "gpt2-adamw"]   # the one quick pays children for
    assert all(f and all(x["warm"] and x["cold"] for x in f.values()) for f in fresh), "a fresh-process load is missing"
    assert probe["cold"] and "io_read" in probe["cold"][0], "the page-cache drop check did not run"


def run(a: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    with scratch("deltackpt-bench-compare-", parent=a.tmp) as tmp:
        out_dir = a.out or (os.path.join(tmp, "out") if a.quick else HERE)
        limits = machine_limits(a.quick, tmp)
        probe = coldcache.probe(tmp, 16 if a.quick else 128)
        print(f"machine: {limits}; page-cache drop works: {probe['works']}", flush=True)
        with compiled(ROOT):   # the fresh processes run deltackpt from bytecode, as torch's (bench/common/bytecode.py)
            results = _workloads(a, tmp)
        argv = sys.argv[1:]
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench " + (" ".join(argv) if argv and argv[0] == "compare" else "compare"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}",
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "limits": limits, "wall_s": time.perf_counter() - t_start,
            "quick": a.quick, "cold_probe": probe,
        }
        bad = failures(results)
        compare_report.write(out_dir, results, meta, charts_for=results[:1] if a.quick else results)
        print(f"wrote {out_dir}/RESULTS.md in {meta['wall_s']:.0f} s", flush=True)
        if bad:
            print(f"NOT BIT-IDENTICAL: {bad}", file=sys.stderr)
            return 1
        if a.quick:
            _check_quick(a, results, probe)
            for r in results:
                if r["workload"] == "gpt2-adamw":   # the table a full run reports (quick sizes: no claims)
                    print("\n".join(compare_report.summary(r)))
        return 0
