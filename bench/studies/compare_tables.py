"""The tables of bench/RESULTS.md beside the per-workload one: what a user feels (every figure as a
ratio to torch.save+fsync of the same version), cold loads and bytes read, fresh-process loads,
live rollbacks, deltackpt's rollback rows, restore throughput by read threads, and the write side
(bytes written and CPU per save)."""

from __future__ import annotations

import math
import statistics

MB = 2**20


def _med(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else float("nan")


def _r(a, b):
    return f"{a / b:.3f}x" if b and not math.isnan(a) and not math.isnan(b) else "–"


def _mib(x):
    return f"{x / MB:.2f}" if x is not None and x >= 0 else "–"


def _spread(x: float, xs: list | None) -> str:
    return f"{x:.3f}" + (f" ({min(xs):.3f}–{max(xs):.3f})" if xs and len(xs) > 1 else "")


def _mm(xs, unit=1.0, fmt="{:.3f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    return f"{fmt.format(_med(xs) * unit)} ({fmt.format(min(xs) * unit)}–{fmt.format(max(xs) * unit)})"


METHOD = (
    "Cold loads: before each one, every file of that system's output (deltackpt: the whole repository; the "
    "others: all their version files) is fsynced and dropped from the page cache with "
    "`posix_fadvise(POSIX_FADV_DONTNEED)` (bench/common/coldcache.py; no root needed); the drop is checked in every "
    "row by `mincore` on a fresh mapping of each file (\"cached after drop\", 0 when it worked) and by the "
    "process's `read_bytes` in /proc/self/io (bytes that reached the disk during the load). Bytes read: "
    "deltackpt counts what the repository's store fetched (a fresh handle over deltackpt.store.counting."
    "CountingStore, as a restarted process would open it: no index, delta or decoded cache in memory; the warm "
    "load goes through the handle that saved, whatever it keeps); the file-based "
    "systems report /proc/self/io read_bytes during the load (whole-file loaders: the file size); "
    "safetensors' `load_file` maps the file, so its pages are read when the tensors are first touched: "
    "that is the \"+ touch\" figure. Ratios are against torch.load of the same version under the same "
    "cold cache (its bytes from disk and its seconds). The drop empties this VM's page cache only: whatever "
    "the hypervisor caches of the virtual disk is out of reach, so cold here means guest-cold.")


def probe_line(p: dict | None) -> str:
    """The run's own check that dropping works here (bench.common.coldcache.probe)."""
    if not p:
        return ""
    cold = ", ".join(f"{c['io_read'] / MB:.0f} MiB from disk in {c['s']:.3f} s with {c['resident_after_drop'] / MB:.1f} "
                     f"MiB cached after the drop" for c in p["cold"])
    return (f"Drop check in this run ({p['MiB']} MiB file, written and fsynced): cold reads {cold}; a warm read "
            f"{p['warm']['io_read'] / MB:.0f} MiB from disk in {p['warm']['s']:.3f} s. "
            + ("The drop works here." if p["works"] else "**The drop did NOT work here: the cold figures are warm.**"))


def cold(r: dict) -> list[str]:
    s = r["systems"]
    ts = s.get("torch.save")
    tsr, tsc = (_med(ts["read"]), _med(ts["load_cold"])) if ts else (float("nan"), float("nan"))
    out = ["Full loads, warm and cold (medians over versions, min–max):", "",
           "| system | warm load s | cold load s | cold / torch.load cold | MiB read (+ touch) | read / torch.load's | "
           "MiB from disk | cached after drop, max MiB | bit-identical |", "|" + "---|" * 9]
    for name, x in s.items():
        touch = _med(x["touch_read"])
        out.append(f"| {name} | {_mm(x['load'])} | {_mm(x['load_cold'])} | {_r(_med(x['load_cold']), tsc)} | "
                   f"{_mib(_med(x['read']))}{f' (+{_mib(touch)})' if touch and touch > 0 else ''} | "
                   f"{_r(_med(x['read']), tsr)} | {_mib(_med(x['io_read']))} | {_mib(max(x['resident'], default=0))} | "
                   f"{'lossy (not checked)' if name == 'deltackpt-q8' else 'yes' if all(x['ok']) else 'NO'} |")
    return out + [""]


def rollback(r: dict) -> list[str]:
    rb = r.get("rollback")
    if not rb:
        return []
    out = [f"deltackpt rollback rows (one repository of {rb['versions']} versions, delta_base "
           f"`{rb['delta_base']}`, keyframe_interval {rb['keyframe_interval']}; cold cache, fresh handle; "
           "live rows restore into the model that holds the latest version):", "",
           "| row | objects decoded per chunk, mean / max | MiB read | read / torch.load's bytes | read / live state | "
           "MiB from disk | cold s, median (min–max) | / cold torch.load | bit-identical |", "|" + "---|" * 9]
    for x in rb["rows"]:
        live = _r(x["store_read"], x["live_bytes"]) if "live_bytes" in x else "–"
        out.append(f"| {x['row']} | {x.get('objects_mean', float('nan')):.2f} / {x.get('objects_max', 0)} | "
                   f"{_mib(x['store_read'])} | {_r(x['store_read'], x['ts_bytes'])} | {live} | {_mib(x['io_read'])} | "
                   f"{_spread(x['s'], x.get('s_all'))} | {_r(x['s'], x['ts_cold_s'])} | {'yes' if x['ok'] else 'NO'} |")
    return out + [""]


def threads(r: dict) -> list[str]:
    t = r.get("read_threads")
    if not t:
        return []
    note = "" if t["library_reads_env"] else (" **This deltackpt does not read DELTACKPT_READ_THREADS: every row used "
                                              "its default pool.**")
    out = [f"Restore of the latest version by read-pool size (DELTACKPT_READ_THREADS, one process per row, "
           f"{r['logical_bytes'] / MB:.1f} MiB of tensors; {t.get('repeats', 1)} rounds, thread counts interleaved, "
           f"the median round's figures, all rounds' seconds in brackets).{note}", "",
           "| threads | cold s | cold MB/s | warm s | warm MB/s | MiB read | bit-identical |", "|" + "---|" * 7]
    for x in t["rows"]:
        if "cold_s" not in x:
            out.append(f"| {x['threads']} | failed | | | | | NO |")
            continue
        out.append(f"| {x['threads']} | {_spread(x['cold_s'], x.get('cold_s_all'))} | {x['cold_MBps']:.0f} | "
                   f"{_spread(x['warm_s'], x.get('warm_s_all'))} | "
                   f"{x['warm_MBps']:.0f} | {_mib(x['cold_store_read'])} | {'yes' if x['ok'] else 'NO'} |")
    return out + [""]


def write_side(r: dict) -> list[str]:
    s = r["systems"]
    bname = "torch.save+fsync" if "torch.save+fsync" in s else "torch.save"
    base = s.get(bname)
    bc = _med(base["cpu"][1:] or base["cpu"]) if base else float("nan")
    out = ["Write side per save after the first (medians, min–max; CPU = user + system seconds of the process, "
           "all threads):", "",
           f"| system | MiB stored | MiB written | CPU s | CPU / {bname} | wall s |", "|" + "---|" * 6]
    for name, x in s.items():
        rest = slice(1, None) if len(x["bytes"]) > 1 else slice(None)
        written = x["written"][rest] if x["written"] else x["bytes"][rest]
        out.append(f"| {name} | {_mm(x['bytes'][rest], 1 / MB, '{:.2f}')} | {_mm(written, 1 / MB, '{:.2f}')} | "
                   f"{_mm(x['cpu'][rest])} | {_r(_med(x['cpu'][rest]), bc)} | {_mm(x['save'][rest])} |")
    return out + [""]


def _ratios(x: list, ref: list) -> float:
    """Median over versions after the first of x / ref, each pair from the same version."""
    pairs = [(a, b) for a, b in zip(x[1:] or x, ref[1:] or ref) if a is not None and b]
    return statistics.median(a / b for a, b in pairs) if pairs else float("nan")


def _f(x: float, nd: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def summary(r: dict) -> list[str]:
    """ANCHORS.md's "At scale" table for one workload: each system's figures as ratios to
    torch.save+fsync (torch.load for reads) of the same version, the anchor's own in brackets."""
    s = r["systems"]
    ref_name = "torch.save+fsync" if "torch.save+fsync" in s else "torch.save"
    ref = s[ref_name]
    names = [ref_name] + [n for n in s if n not in (ref_name, "torch.save")]
    fresh, live = r.get("fresh") or {}, r.get("live_rollback") or {}
    state = r["logical_bytes"]

    def per(key: str, unit: str = "s", scale: float = 1.0) -> list[str]:
        cells = []
        for n in names:
            v = _ratios(s[n][key], ref[key])
            own = _med(ref[key][1:] or ref[key]) * scale
            cells.append(f"1.00 ({own:.2f} {unit})" if n == ref_name else _f(v))
        return cells

    def kept(n: str) -> str:
        k = s[n]["kept"][-1] if s[n]["kept"] else float("nan")
        return f"{k / MB:+.0f} MiB ({k / state:+.2f}x)"

    def fresh_cell(n: str) -> str:
        f, fr = fresh.get(n), fresh.get(ref_name)
        if not f or not fr or not f["warm"] or not fr["warm"]:
            return "–"
        w, c, rw, rc = _med(f["warm"]), _med(f["cold"]), _med(fr["warm"]), _med(fr["cold"])
        return f"1.00 ({rw:.2f} s) / 1.00 ({rc:.2f} s)" if n == ref_name else f"{_f(w / rw)} / {_f(c / rc)}"

    def live_cell(n: str) -> str:
        x, xr = live.get(n), live.get(ref_name)
        if not x or not xr:
            return "–"
        wall = f"1.00 ({xr['s']:.2f} s)" if n == ref_name else _f(x["s"] / xr["s"])
        return f"{wall} / {x['extra_bytes'] / MB:+.0f} MiB"

    rows = [("later save wall", per("save")), ("CPU per later save", per("cpu")),
            ("bytes written per later save", per("written", "MiB", 1 / MB)),
            ("stored per added version", per("bytes", "MiB", 1 / MB)),
            ("memory kept after the saves returned (x the state)", [kept(n) for n in names]),
            ("newest version, fresh process, warm / cold (torch.load)", [fresh_cell(n) for n in names]),
            (f"one layer (`{r['layer']}`) cold, MiB read", [_mib(_med(s[n]["layer_read"])) for n in names]),
            ("live rollback by one version: wall / extra memory", [live_cell(n) for n in names])]
    out = [f"State {state / MB:.0f} MiB of tensors, {r['versions']} versions; medians over versions after the first "
           "of per-version ratios (fresh-process loads: median over rounds).", "",
           "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    out += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return out + [""]


def fresh_loads(r: dict) -> list[str]:
    f = r.get("fresh")
    if not f:
        return []
    out = ["The newest version loaded by a fresh process (the system's package imported before the clock, what "
           "its first load imports inside it, deltackpt's modules from bytecode as installed; warm: its files in "
           "the page cache, cold: dropped first), seconds per round:", "",
           "| system | warm s | cold s | MiB from disk (cold) | bit-identical |", "|---|---|---|---|---|"]
    for n, x in f.items():
        out.append(f"| {n} | {_mm(x['warm'])} | {_mm(x['cold'])} | {_mib(_med(x['io_read']))} | {'yes' if x['ok'] else 'NO'} |")
    return out + [""]


def live_rollbacks(r: dict) -> list[str]:
    lv = r.get("live_rollback")
    if not lv:
        return []
    out = ["Live rollback by one version into the model (and optimizer) holding the latest, cold: torch.load + "
           "load_state_dict, dcp.load into the live tensors, deltackpt.restore on a fresh handle:", "",
           "| system | s | extra memory at peak, MiB | MiB from disk | bit-identical |", "|---|---|---|---|---|"]
    for n, x in lv.items():
        out.append(f"| {n} | {x['s']:.3f} | {x['extra_bytes'] / MB:.0f} | {_mib(x['io_read'])} | {'yes' if x['ok'] else 'NO'} |")
    return out + [""]


def all_tables(r: dict) -> list[str]:
    return cold(r) + fresh_loads(r) + live_rollbacks(r) + rollback(r) + threads(r) + write_side(r)
