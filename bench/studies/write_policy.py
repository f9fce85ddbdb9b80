"""What a save-time write policy costs, simulated per chunk position over cached real states
(the delta_sizes study's cache), without a repository: bytes written per save against bytes read
and objects decoded for the newest version.

For every changed chunk it measures once the keyframe (bg-zstd), the forward delta against the
previous version, and deltas against each of the W versions before (what a cumulative delta since
an anchor keyframe would cost); the policies are then replayed over those sizes:

* ``chain(a, f)``: a forward delta when it is at most ``a`` x the anchor keyframe and the chain's
  deltas since the anchor stay within ``f`` x it (and depth <= K), else a new keyframe;
* ``cumulative(a, f)``: the delta against the anchor itself (a differential since the keyframe),
  under the same two bounds;
* ``keyframe``: every changed chunk whole (format 2's head, without its reverse delta).

    PYTHONPATH=. python bench/write_policy.py --cache /work/cache --workloads recsys,full --versions 10
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
from dataclasses import dataclass, field

from bench.common.scratch import scratch
from bench.common.states import generate, tensors
from bench.studies.delta_sizes_sims import chunks, ctx_of
from deltackpt.codecs.pipeline import BaseChunk, encode_chunk
from deltackpt.codecs.registry import BG_ZSTD, SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA

SUMMARY = "save-time write policies replayed per chunk over cached states: bytes written per save vs the newest version's read"
WRITES = "stdout; --out FILE; --budget-curve PNG"

OVERHEAD = 100          # object header + params + index entry + manifest reference, about
DELTAS = (XOR_DELTA, SUB_DELTA, SCALED_DELTA, SPARSE)


@dataclass
class Position:
    raw: int
    kf: list = field(default_factory=list)       # keyframe bytes per version (None: unchanged)
    d: dict = field(default_factory=dict)        # (i, j) -> delta bytes of version j against version i
    changed: list = field(default_factory=list)


def measure(files: list[str], chunk_bytes: int, window: int) -> tuple[list[Position], list[int]]:
    positions: dict = {}
    history: dict = {}     # position -> recent raw chunks (up to window + 1)
    tsizes = []
    for j, f in enumerate(files):
        cur, tsize = tensors(f)
        tsizes.append(tsize)
        for name, arr in cur.items():
            for i, (s, raw, row) in enumerate(chunks(arr, chunk_bytes)):
                key = (name, i)
                pos = positions.setdefault(key, Position(len(raw)))
                past = history.setdefault(key, [])
                ctx = ctx_of(arr, row)
                changed = not past or past[-1] != raw
                pos.changed.append(changed)
                if not changed:
                    pos.kf.append(None)
                else:
                    pos.kf.append(len(encode_chunk(raw, ctx, candidates=(BG_ZSTD,)).encoded.payload) + OVERHEAD)
                    for back, old in enumerate(reversed(past)):
                        if len(old) == len(raw):
                            enc = encode_chunk(raw, ctx, base=BaseChunk(b"\0" * 16, old, 0), candidates=DELTAS,
                                               keyframe_interval=1 << 20)
                            pos.d[(j - 1 - back, j)] = len(enc.encoded.payload) + OVERHEAD
                past.append(raw)
                del past[:-window]
    return list(positions.values()), tsizes


def replay(positions: list[Position], nver: int, kind: str, a: float, f: float, k: int, beta: float = 0.0) -> dict:
    """Per save after the first: bytes written; for the newest version: bytes read and objects."""
    written = [0] * nver
    read = [0] * nver
    objects = [0] * nver
    chunks_n = len(positions)
    for p in positions:
        anchor = 0           # version holding the anchor keyframe
        anchor_kf = p.kf[0]
        chain = [anchor_kf]  # stored sizes the newest version reads at this position
        last_written = 0     # version whose chunk is the head (for chains)
        for j in range(1, nver):
            if p.changed[j]:
                kf = p.kf[j]
                if kind == "keyframe":
                    use = None
                elif kind == "chain":
                    use = p.d.get((j - 1, j))
                    use = use if (use is not None and use <= a * anchor_kf and sum(chain[1:]) + use <= f * anchor_kf
                                  and len(chain) <= k) else None
                elif kind == "cumulative":
                    use = p.d.get((anchor, j))
                    use = use if use is not None and use <= a * anchor_kf and use <= f * anchor_kf else None
                else:  # mixed: the cumulative delta when it costs little more than the chain's, else the chain
                    fwd, cum = p.d.get((j - 1, j)), p.d.get((anchor, j)) if anchor != j - 1 else None
                    if cum is not None and fwd is not None and cum <= (1 + beta) * fwd and cum <= a * anchor_kf:
                        use, kind_now = cum, "cum"
                    else:
                        use, kind_now = fwd, "chain"
                        use = use if (use is not None and use <= a * anchor_kf and sum(chain[1:]) + use <= f * anchor_kf
                                      and len(chain) <= k) else None
                if use is None:
                    written[j] += kf
                    anchor, anchor_kf, chain = j, kf, [kf]
                else:
                    written[j] += use
                    if kind == "chain" or (kind == "mixed" and kind_now == "chain"):
                        chain = chain + [use]
                    else:
                        chain = [anchor_kf, use]
                last_written = j
            read[j] += sum(chain)
            objects[j] += len(chain)
        del last_written
    return {"written": written[1:], "read": read[1:], "objects": [o / chunks_n for o in objects[1:]]}


POLICIES = [("keyframe", 0, 0)] + [("chain", a, f) for a in (0.3, 0.5, 0.7) for f in (0.25, 0.5, 1.0, 2.0)] + \
    [("cumulative", a, f) for a in (0.3, 0.5, 0.7) for f in (0.5, 1.0)] + \
    [("mixed", a, f, b) for a in (0.5, 0.7) for f in (0.5, 1.0) for b in (0.25, 0.5, 1.0)]


def budget_curve(positions: list[Position], tsizes: list[int], budgets=(0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0,
                                                                       1.5, 2.0, 4.0), k: int = 8) -> list[dict]:
    """The single knob the library has (head.py's HEAD_DELTA_BUDGET: deltas since a position's
    keyframe <= budget x that keyframe) swept: per budget, mean bytes written per later save and
    the newest version's bytes read and objects per chunk (both as chains and as cumulative deltas)."""
    out = []
    n = len(tsizes)
    for f in budgets:
        row = {"budget": f}
        for kind in ("chain", "cumulative"):
            r = replay(positions, n, kind if f > 0 else "keyframe", f, f, k)
            row[kind] = {"written": statistics.mean(x / t for x, t in zip(r["written"], tsizes[1:])),
                         "read": statistics.mean(x / t for x, t in zip(r["read"], tsizes[1:])),
                         "objects": statistics.mean(r["objects"])}
        out.append(row)
    return out


def plot_curve(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for kind, style in (("chain", "o-"), ("cumulative", "s--")):
        xs = [r[kind]["written"] for r in rows]
        ax1.plot(xs, [r[kind]["read"] for r in rows], style, label=kind)
        ax2.plot(xs, [r[kind]["objects"] for r in rows], style, label=kind)
        for r, x in zip(rows, xs):
            if kind == "chain":
                ax1.annotate(f"{r['budget']:g}", (x, r[kind]["read"]), fontsize=7, xytext=(3, 3),
                             textcoords="offset points")
                ax2.annotate(f"{r['budget']:g}", (x, r[kind]["objects"]), fontsize=7, xytext=(3, 3),
                             textcoords="offset points")
    ax1.set_xlabel("bytes written per save / torch.save")
    ax1.set_ylabel("newest version: bytes read / torch.save")
    ax2.set_xlabel("bytes written per save / torch.save")
    ax2.set_ylabel("newest version: objects decoded per chunk")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cache", default=None, help="the cached states (delta_sizes --cache); trained there if missing "
                    "(default: a scratch folder)")
    ap.add_argument("--workloads", default=None, help="default recsys,full,frozen,gpt,cnn (quick: recsys,gpt2)")
    ap.add_argument("--versions", type=int, default=None, help="default 10, quick 4")
    ap.add_argument("--chunk-bytes", type=int, default=2 << 20)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--out")
    ap.add_argument("--budget-curve", default=None, metavar="PNG", help="also sweep the budget and plot it here")


def run(args: argparse.Namespace) -> int:
    names = (args.workloads or ("recsys,gpt2" if args.quick else "recsys,full,frozen,gpt,cnn")).split(",")
    versions = args.versions or (4 if args.quick else 10)
    results = {}
    with scratch("deltackpt-bench-write-policy-", keep=args.cache, parent=args.tmp) as cache:
        for w in names:
            files = generate(w, versions, cache, quick=args.quick)
            memo = os.path.join(cache, f"{w}{'-quick' if args.quick else ''}.policy-sizes-{len(files)}.pkl")
            if os.path.exists(memo):
                with open(memo, "rb") as fh:
                    positions, tsizes = pickle.load(fh)
            else:
                positions, tsizes = measure(files, args.chunk_bytes, args.window)
                with open(memo, "wb") as fh:
                    pickle.dump((positions, tsizes), fh)
            results[w] = _table(w, positions, tsizes, files, args.k)
            curve_png = args.budget_curve or (os.path.join(cache, f"{w}-budget.png") if args.quick else None)
            if curve_png:
                rows = budget_curve(positions, tsizes, k=args.k)
                plot_curve(rows, curve_png if len(names) == 1 or args.quick else curve_png.replace(".png", f"-{w}.png"),
                           f"{w}: the budget knob")
                results[w]["budget_curve"] = rows
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh)
    return 0


def _table(w: str, positions: list[Position], tsizes: list[int], files: list[str], k: int) -> dict:
    ts = statistics.median(tsizes)
    rows = {}
    print(f"## {w}: {len(files)} versions, {len(positions)} chunk positions, torch.save {ts / 1e6:.1f} MB")
    print("| policy | written/save mean | median | newest read mean | max | objects/chunk mean | max |")
    print("|---|---|---|---|---|---|---|")
    for kind, a, f, *beta in POLICIES:
        r = replay(positions, len(files), kind, a, f, k, *beta)
        wr = [x / t for x, t in zip(r["written"], tsizes[1:])]
        rd = [x / t for x, t in zip(r["read"], tsizes[1:])]
        label = kind if kind == "keyframe" else f"{kind} a={a} f={f}" + (f" b={beta[0]}" if beta else "")
        rows[label] = {"written": wr, "read": rd, "objects": r["objects"]}
        print(f"| {label} | {statistics.mean(wr):.3f} | {statistics.median(wr):.3f} | {statistics.mean(rd):.3f} | "
              f"{max(rd):.3f} | {statistics.mean(r['objects']):.2f} | {max(r['objects']):.2f} |", flush=True)
    return rows
