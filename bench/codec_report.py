"""Markdown tables for bench/DELTAS.md's "Speed" section from bench/codec_speed.py's JSON.

    python bench/codec_report.py /tmp/codec_speed.json
"""

from __future__ import annotations

import json
import sys

WORKLOADS = ("frozen", "full", "recsys", "gpt")


def _f(v, nd: int = 0) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def codec_table(rep: dict) -> list[str]:
    """Per workload and codec: this tree against the baseline's, ratio and single-thread MB/s."""
    lines = ["| workload | codec | share of chunks | ratio | encode MB/s (before) | decode MB/s (before) | memcpy 256 MiB / 2 MiB, MB/s |",
             "|---|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        if w not in rep:
            continue
        mem = rep[w]["memcpy GB/s"]
        mc = f"{mem['memcpy 256 MiB'] * 1e3:.0f} / {mem['memcpy 2 MiB in cache'] * 1e3:.0f}"
        for sec in ("keyframes", "deltas"):
            for name, row in rep[w][sec].items():
                if name.endswith("(before)") or not row["share"]:
                    continue
                old = rep[w][sec].get(name + " (before)", {})
                lines.append(f"| {w} | {name} | {row['share']:.2f} | {_f(row['ratio'], 4)} | "
                             f"{_f(row['encode MB/s'])} ({_f(old.get('encode MB/s'))}) | "
                             f"{_f(row['decode MB/s'])} ({_f(old.get('decode MB/s'))}) | {mc} |")
    return lines


def alternatives_table(rep: dict, sec: str) -> list[str]:
    """Rows: alternatives; ratio per workload, then encode / decode MB/s per workload."""
    ws = [w for w in WORKLOADS if w in rep and "alternatives" in rep[w]]
    names = list(rep[ws[0]]["alternatives"][sec]) if ws else []
    head = " | ".join(f"ratio {w}" for w in ws)
    lines = [f"| alternative ({sec}) | {head} | encode MB/s ({' / '.join(ws)}) | decode MB/s ({' / '.join(ws)}) |",
             "|---|" + "---|" * (len(ws) + 2)]
    for name in names:
        rows = [rep[w]["alternatives"][sec].get(name, {}) for w in ws]
        if any("skipped" in r for r in rows):
            continue
        ratios = " | ".join(_f(r.get("ratio"), 4) for r in rows)
        enc = " / ".join(_f(r.get("encode MB/s")) for r in rows)
        dec = " / ".join(_f(r.get("decode MB/s")) for r in rows)
        lines.append(f"| {name} | {ratios} | {enc} | {dec} |")
    mem = " / ".join(f"{rep[w]['memcpy GB/s']['memcpy 256 MiB'] * 1e3:.0f}" for w in ws)
    lines.append("| memcpy 256 MiB in the same runs |" + " |" * len(ws) + f" {mem} | {mem} |")
    return lines


def threads_table(rep: dict) -> list[str]:
    lines = ["| workload | 1 thread decode MB/s | 2 threads decode MB/s |", "|---|---|---|"]
    for w in WORKLOADS:
        if w in rep:
            t = rep[w]["threads"]
            lines.append(f"| {w} | {t['1 thread(s) decode MB/s']:.0f} | {t['2 thread(s) decode MB/s']:.0f} |")
    return lines


def main() -> None:
    rep = json.load(open(sys.argv[1]))
    for part in (codec_table(rep), alternatives_table(rep, "keyframes"), alternatives_table(rep, "deltas"),
                 threads_table(rep)):
        print("\n".join(part))
        print()


if __name__ == "__main__":
    main()
