"""Benchmark deltackpt against torch.save, safetensors, HDF5, zstd and ZipNN on real training runs.

    python -m bench.run            # full run, writes bench/RESULTS.md and bench/charts/*.png
    python -m bench.run --quick    # CI: tiny sizes; asserts every system ran and every restore is
                                   # bit-identical, nothing about speed; writes into a temp folder
    python -m bench.run --only minilm-full --systems deltackpt torch.save --out /tmp/r   # rollback rows

Every full load is timed twice: warm (just after the save) and cold (the system's files dropped
from the page cache first, bench/coldcache.py).  Systems are interleaved within each version (the
order rotates) because write timings on a shared VM depend on what ran just before.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
import time

import torch

from bench import coldcache, read_threads, report, rollback
from bench.measure import digests, machine_limits, rss, same, tensor_bytes, timed, timed_cpu
from bench.scratch import scratch
from bench.systems import _size as repo_size
from bench.systems import layer_keys, split, systems
from bench.workloads import workloads

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("bytes", "save", "cpu", "written", "load", "load_cold", "read", "io_read", "touch_read", "resident",
        "layer", "first_save", "ok")


def _dir(base: str, s, v: int) -> str:
    return os.path.join(base, s.name) if s.versioned else os.path.join(base, s.name, f"v{v}")


def _cold_load(s, base: str, d: str, vid: str | None, dig: dict) -> dict:
    """A cold full load: deltackpt through a fresh counting handle (bytes the store fetched), the
    others through their loader (bytes that reached the disk, and those the first touch of every
    tensor adds: safetensors maps the file and reads on touch)."""
    if s.versioned:
        row = rollback.cold_load(d, vid, dig)
        return {"s": row["s"], "read": row["store_read"], "io_read": row["io_read"], "touch_read": 0,
                "resident": row["resident_after_drop"], "ok": row["ok"] or not s.lossless}
    dt, got, io = coldcache.cold(s.load, coldcache.files_under(os.path.join(base, s.name)), d)
    r0 = coldcache.io_read_bytes()
    ok = same(dig, got) if s.lossless else True
    touch = coldcache.io_read_bytes() - r0
    return {"s": dt, "read": io["io_read"], "io_read": io["io_read"], "touch_read": touch,
            "resident": io["resident_after_drop"], "ok": ok}


class _Run:
    """One workload's figures as they accumulate: per system, per version."""

    def __init__(self, syss) -> None:
        self.res = {s.name: {k: [] for k in KEYS} for s in syss}
        self.vids: dict[str, list] = {s.name: [] for s in syss if s.versioned}
        self.digs: list[dict] = []


def _save_all(run: _Run, order, state, base: str, v: int) -> None:
    for s in order:   # save, interleaved
        d = _dir(base, s, v)
        before = repo_size(d) if s.versioned and os.path.isdir(d) else 0
        dt, cpu, n = timed_cpu(s.save, state, d)
        s.settle()
        if s.versioned:  # the repository's growth once the background deltification the save started is done
            n = repo_size(d) - before
        r = run.res[s.name]
        r["bytes"].append(n)
        r["save"].append(dt)
        r["cpu"].append(cpu)
        if s.versioned:
            run.vids[s.name].append(s.last.id)
            r["written"].append(s.last.written_bytes)


def _first_saves(run: _Run, syss, order, state, base: str, repeats: int) -> None:
    """Extra first-save repeats into fresh folders (removed at once), beside the first version's save."""
    import deltackpt
    for rep in range(repeats - 1):
        for s in order[rep % len(order):] + order[:rep % len(order)]:
            d = os.path.join(base, "scratch", f"{s.name}-{rep}")
            dt, _ = timed(s.save, state, d)
            run.res[s.name]["first_save"].append(dt)
            if s.versioned:
                deltackpt.Repo(d).close()
            shutil.rmtree(d)
    for s in syss:
        run.res[s.name]["first_save"].append(run.res[s.name]["save"][0])


def _load_all(run: _Run, order, base: str, v: int, dig: dict, lay: list[str], layer: str) -> None:
    for s in order:   # warm full load, cold full load, one-layer load of the version just saved
        d, r = _dir(base, s, v), run.res[s.name]
        dt, got = timed(s.load, d)
        r["load"].append(dt)
        ok = same(dig, got) if s.lossless else True
        del got
        c = _cold_load(s, base, d, run.vids[s.name][-1] if s.versioned else None, dig)
        for k in ("read", "io_read", "touch_read", "resident"):
            r[k].append(c[k])
        r["load_cold"].append(c["s"])
        dt, got = timed(s.load_layer, d, layer)
        r["layer"].append(dt)
        ok_l = same(dig, digests(got), lay) if s.lossless or v == 0 else True
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
    rp, cs = rollback.open_counted(repo)
    rp.load(layers=[f"model.{layer}"])
    layer_read = cs.bytes_read
    rp.close()
    rp, cs = rollback.open_counted(repo)
    rp.load()
    full_read = cs.bytes_read
    rp.close()
    return layer_read, full_read


def _rss_rows(rss_names: list[str], base: str, v: int) -> dict:
    """Peak RSS of a save and a load per system, each in a child process whose files go under
    ``base`` (removed by the caller even where a child was killed)."""
    out = {}
    last_pt = os.path.join(base, "torch.save", f"v{v - 1}", "ckpt.pt")
    for name in rss_names:
        d = os.path.join(base, "rss-" + name)
        out[name] = {"save": rss("save", name, last_pt, d), "load": rss("load", name, last_pt, d)}
        shutil.rmtree(d, ignore_errors=True)
    return out


def bench_workload(w, syss, tmp: str, repeats: int, rss_names: list[str], threads: list[int],
                   rb_repeats: int = 1) -> dict:
    """Every figure of one workload; its files go under a folder of ``tmp``, removed before returning."""
    import deltackpt
    base = tempfile.mkdtemp(prefix=w.name + "-", dir=tmp)
    try:
        run, live = _Run(syss), {}
        v, logical, t_gen = _versions(w, syss, base, repeats, live, run)
        _rollback_oldest(run, syss, base)
        repo = os.path.join(base, "deltackpt")
        ts = run.res.get("torch.save")
        rb = rollback.rows(repo, run.digs, live, ts["bytes"] if ts else [0] * v,
                           ts["load_cold"] if ts else [float("nan")] * v, rb_repeats)
        print(f"  {w.name} rollback: " + ", ".join(f"{x['row']} {x['s']:.3f}s" for x in rb["rows"]), flush=True)
        thr = read_threads.measure(repo, threads, run.digs[-1], logical, rb_repeats) if threads else None
        layer_read, full_read = _bytes_read(repo, w.layer)
        out = {"workload": w.name, "versions": v, "logical_bytes": logical, "train_s": t_gen, "layer": w.layer,
               "layer_bytes_read": layer_read, "full_bytes_read": full_read, "systems": run.res, "rss": {},
               "rollback": rb, "read_threads": thr}
        out["rss"] = _rss_rows(rss_names, base, v)
        for s in syss:
            if s.versioned:
                deltackpt.Repo(os.path.join(base, s.name)).close()
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def failures(results: list[dict]) -> list[tuple]:
    """Every (workload, row) whose restore was not bit-identical, or a system that saved nothing."""
    bad = [(r["workload"], n) for r in results for n, x in r["systems"].items() if not all(x["ok"]) or not x["bytes"]]
    bad += [(r["workload"], x["row"]) for r in results for x in r["rollback"]["rows"] if not x["ok"]]
    bad += [(r["workload"], f"read threads {x['threads']}") for r in results
            for x in (r["read_threads"] or {}).get("rows", []) if not x["ok"]]
    return bad


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny CI run: checks, no speed claims")
    ap.add_argument("--scale", action="store_true", help="add the >= 2 GB scale workload (untested, needs ~8 GB)")
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--systems", nargs="*", help="system names to run (deltackpt and torch.save always run)")
    ap.add_argument("--delta-base", default=None, help="config delta_base of deltackpt's repositories (default: the library's)")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    ap.add_argument("--threads", default="1,2", help="read-pool sizes for the restore throughput table ('' skips it)")
    ap.add_argument("--repeats", type=int, default=None, help="first-save repeats (default 3, quick 2)")
    ap.add_argument("--rollback-repeats", type=int, default=None,
                    help="runs of each rollback row and read-threads child (median; default 3, quick 1)")
    ap.add_argument("--tmp", default=os.environ.get("BENCH_TMP"),
                    help="where the scratch folder goes (default: system temp); it is removed however the run ends")
    ap.add_argument("--out", default=None, help="where RESULTS.md, results.json and charts/ go (default: bench/, quick: temp)")
    return ap


def _workloads(a: argparse.Namespace, tmp: str) -> list[dict]:
    repeats = a.repeats or (2 if a.quick else 3)
    threads = [int(x) for x in a.threads.split(",") if x]
    rb_repeats = a.rollback_repeats or (1 if a.quick else 3)
    results = []
    for w in workloads(a.quick, a.scale):
        if a.only and w.name not in a.only:
            continue
        syss = systems(scale=w.name == "scale", delta_base=a.delta_base)
        if a.systems:
            syss = [s for s in syss if s.name in set(a.systems) | {"deltackpt", "torch.save"}]
        if a.quick:
            rss_names = ["deltackpt", "torch.save"] if w.name == "minilm-frozen" else []
        else:
            rss_names = [s.name for s in syss] if w.name in ("minilm-frozen", "scale") else ["deltackpt", "torch.save"]
        rss_names = [] if a.no_rss else rss_names
        print(f"workload {w.name}", flush=True)
        thr = threads if not a.quick or w.name == "minilm-frozen" else []   # quick: one child pair is enough
        results.append(bench_workload(w, syss, tmp, 1 if w.name == "scale" else repeats, rss_names, thr, rb_repeats))
    return results


def _check_quick(a: argparse.Namespace, results: list[dict], probe: dict) -> None:
    """CI's checks: every system ran, every row is there; nothing about speed."""
    ran = {n for r in results for n in r["systems"] if r["systems"][n]["bytes"]}
    want = {s.name for s in systems()} if not a.systems else set()
    assert want <= ran, f"systems that did not run: {want - ran}"
    assert all(r["rss"].get(n, {}).get("save") and r["rss"][n].get("load") for r in results for n in r["rss"]), "rss child failed"
    assert all(len(r["systems"][n]["load_cold"]) == r["versions"] for r in results for n in r["systems"]), "a cold load is missing"
    assert all(len(r["rollback"]["rows"]) >= 5 for r in results), "rollback rows missing"
    assert probe["cold"] and "io_read" in probe["cold"][0], "the page-cache drop check did not run"


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    with scratch("deltackpt-bench-", parent=a.tmp) as tmp:
        out_dir = a.out or (os.path.join(tmp, "out") if a.quick else HERE)
        limits = machine_limits(a.quick, tmp)
        probe = coldcache.probe(tmp, 16 if a.quick else 128)
        print(f"machine: {limits}; page-cache drop works: {probe['works']}", flush=True)
        results = _workloads(a, tmp)
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench.run " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, torch {torch.__version__}",
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "limits": limits, "wall_s": time.perf_counter() - t_start,
            "quick": a.quick, "cold_probe": probe,
        }
        bad = failures(results)
        report.write(out_dir, results, meta)
        print(f"wrote {out_dir}/RESULTS.md in {meta['wall_s']:.0f} s", flush=True)
        if bad:
            print(f"NOT BIT-IDENTICAL: {bad}", file=sys.stderr)
            return 1
        if a.quick:
            _check_quick(a, results, probe)
        return 0


if __name__ == "__main__":
    sys.exit(main())
