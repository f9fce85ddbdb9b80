"""How many bytes each new version costs, per codec, per tensor kind, lossy or not, by chunk size and
keyframe interval, and how long restoring the deepest version of a chain takes.

    python -m bench delta_sizes --workloads full,frozen,recsys --versions 7 --out /tmp/deltas.json
    python -m bench delta_sizes --workloads full --sections bases --record deltas_bases  # into results/delta_sizes.json

States come from the real training runs of bench/common/workloads.py (names: full, frozen, recsys,
gpt, cnn, gpt2, gpt2-bf16).  With --cache DIR they are kept there as .npz (one file per version:
about --versions x the state's size per workload, ~2.7 GB for minilm-full at 10 versions; delete
DIR when done), so the sections can be re-run without training again; without it they go to a
scratch folder removed at exit.  Sections: codecs, chunks, lossy, keyframes, restore (default),
topology, entropy, bases, write.  Every ratio is bytes / torch.save bytes of the same state;
"median" is over versions after the first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from bench.common import record
from bench.common.scratch import scratch
from bench.common.states import generate, tensors
from bench.studies.delta_sizes_bases import BASES_HEADER, bases_table, compare_bases, restore_times
from bench.studies.delta_sizes_sims import chunks, ctx_of, distance_costs, entropy_pass, kind, topology_table
from deltackpt.codecs.pipeline import BaseChunk, encode_chunk
from deltackpt.codecs.registry import BG_ZSTD, SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA

SUMMARY = ("bytes per new version by codec, tensor kind, chunk size, keyframe interval, topology, lossy mode; "
           "write path and deltification on real repositories")
WRITES = "stdout; --out FILE; --record KEY: bench/results/delta_sizes.json"
ALL_SECTIONS = "codecs,chunks,lossy,keyframes,restore,topology,entropy,bases,write"

MIB = 1 << 20
SETS = {"keyframe": (BG_ZSTD,), "xor": (XOR_DELTA,), "sub": (SUB_DELTA,), "scaled": (SCALED_DELTA,),
        "sparse": (SPARSE,), "pipeline": None}


def lossless_pass(prev: dict, cur: dict, chunk_bytes: int, sets=SETS) -> dict:
    """Bytes per codec set and tensor kind for one version against its parent (lossless)."""
    out: dict = {}
    secs: dict = {}
    for name, arr in cur.items():
        base_arr = prev.get(name)
        k = kind(name)
        for s, raw, row in chunks(arr, chunk_bytes):
            ctx = ctx_of(arr, row)
            base = None
            if base_arr is not None and base_arr.shape == arr.shape:
                b = base_arr.reshape(-1).view(np.uint8)[s:s + len(raw)].tobytes()
                base = BaseChunk(b"\0" * 16, b, 0) if b != raw else "same"
            for label, cands in sets.items():
                t0 = time.perf_counter()
                if base == "same":
                    n = 0
                else:
                    n = len(encode_chunk(raw, ctx, base=base, candidates=cands).encoded.payload) + 40
                secs[label] = secs.get(label, 0.0) + time.perf_counter() - t0
                out[(label, k)] = out.get((label, k), 0) + n
                out[(label, "all")] = out.get((label, "all"), 0) + n
        out[("raw", k)] = out.get(("raw", k), 0) + arr.nbytes
        out[("raw", "all")] = out.get(("raw", "all"), 0) + arr.nbytes
    return {"bytes": out, "seconds": secs}


def lossy_chain(files: list[str], modes: dict[str, str], chunk_bytes: int, keyframe_interval: int) -> list[dict]:
    """Encode a chain where ``modes`` maps tensor kind -> lossy mode; bases are the DECODED previous versions."""
    decoded: dict[str, list] = {}
    depth: dict = {}
    per_version = []
    for f in files:
        cur, tsize = tensors(f)
        total, maxerr = 0, 0.0
        for name, arr in cur.items():
            mode = modes.get(kind(name), "lossless")
            new_dec = []
            for i, (s, raw, row) in enumerate(chunks(arr, chunk_bytes)):
                prev = decoded.get(name)
                base = None
                if prev is not None and i < len(prev) and len(prev[i]) == len(raw):
                    base = BaseChunk(b"\0" * 16, prev[i], depth[(name, i)])
                if mode == "lossless" and base is not None and base.data == raw:
                    new_dec.append(raw)
                    continue
                ch = encode_chunk(raw, ctx_of(arr, row), mode=mode, base=base, keyframe_interval=keyframe_interval)
                total += len(ch.encoded.payload) + 40
                maxerr = max(maxerr, ch.encoded.max_abs_err)
                new_dec.append(ch.encoded.recon if ch.encoded.recon is not None else raw)
                depth[(name, i)] = ch.depth
            decoded[name] = new_dec
        per_version.append({"ratio": total / tsize, "max_abs_err": maxerr})
    return per_version


def median_after_first(xs: list[float]) -> float:
    return statistics.median(xs[1:]) if len(xs) > 1 else float("nan")


def _codecs(files: list[str], rep: dict, keyframes: bool, w: str) -> None:
    """Bytes per version by codec set and tensor kind; with ``keyframes``, amortized bytes by K."""
    per = []
    prev, _ = tensors(files[0])
    for f in files[1:]:
        cur, tsize = tensors(f)
        r = lossless_pass(prev, cur, 2 * MIB)
        per.append((r, tsize))
        prev = cur
    table = {}
    for label in SETS:
        for k in ("all", "weights", "exp_avg", "exp_avg_sq"):
            denom = [(r["bytes"].get(("raw", k), 0) if k != "all" else t) for r, t in per]
            if not denom[0]:
                continue
            vals = [r["bytes"].get((label, k), 0) / d for (r, _), d in zip(per, denom)]
            table[f"{label}/{k}"] = statistics.median(vals)
    raw_total = sum(per[0][0]["bytes"][("raw", "all")] for _ in [0])
    table["encode_MBps"] = {label: raw_total / 1e6 / statistics.median(r["seconds"][label] for r, _ in per)
                            for label in SETS}
    table["torch_save_bytes"] = per[0][1]
    table["per_version_pipeline"] = [r["bytes"][("pipeline", "all")] / t for r, t in per]
    rep["codecs"] = table
    print(w, json.dumps(table, indent=1), flush=True)
    if keyframes:
        # a cycle is one keyframe of the chunks that changed, then K deltas (depth <= K);
        # unchanged chunks are reused whatever K is
        delta = statistics.median(r["bytes"][("pipeline", "all")] for r, _ in per)
        kf = statistics.median(r["bytes"][("keyframe", "all")] for r, _ in per)
        tsize = per[0][1]
        rep["keyframes_bytes"] = {K: (kf + K * delta) / (K + 1) / tsize for K in (4, 8, 16, 32)}
        print(w, "amortized bytes by K", rep["keyframes_bytes"], flush=True)


def _entropy(files: list[str]) -> dict:
    a0, _ = tensors(files[-2])
    a1, tsize = tensors(files[-1])
    e = entropy_pass(a0, a1)
    res = {f"{k}/{c}": v / tsize for (k, c), v in e.items()}
    res["all/best"] = sum(v for (k, c), v in e.items() if c == "best") / tsize
    res["all/changed_rows_best"] = sum(v for (k, c), v in e.items() if c == "changed_rows_best") / tsize
    return res


def _chunks(files: list[str]) -> dict:
    res = {}
    a0, _ = tensors(files[-2])
    a1, tsize = tensors(files[-1])
    for cb in (1, 2, 4):
        r = lossless_pass(a0, a1, cb * MIB, {"pipeline": None})
        res[f"{cb}MiB"] = {"ratio": r["bytes"][("pipeline", "all")] / tsize,
                           "MBps": r["bytes"][("raw", "all")] / 1e6 / r["seconds"]["pipeline"]}
    return res


LOSSY = {"q8-optimizer": {"exp_avg": "q8-delta", "exp_avg_sq": "q8-delta"},
         "q8-all": {"exp_avg": "q8-delta", "exp_avg_sq": "q8-delta", "weights": "q8-delta"},
         "q4-optimizer": {"exp_avg": "q4-delta", "exp_avg_sq": "q4-delta"},
         "q4-all": {"exp_avg": "q4-delta", "exp_avg_sq": "q4-delta", "weights": "q4-delta"},
         "q8-weights-q4-optimizer": {"exp_avg": "q4-delta", "exp_avg_sq": "q4-delta", "weights": "q8-delta"}}


def _lossy(files: list[str]) -> dict:
    res = {}
    for label, modes in LOSSY.items():
        chain = lossy_chain(files, modes, 2 * MIB, 64)
        res[label] = {"median": median_after_first([c["ratio"] for c in chain]),
                      "max_abs_err": max(c["max_abs_err"] for c in chain)}
    return res


def _workload(w: str, files: list[str], secs: list[str], a: argparse.Namespace, bases: list[str] | None,
              bases_rows: list[str], write_rows: list[str]) -> dict:
    """Every requested section for one workload's cached versions."""
    rep: dict = {}
    if "codecs" in secs or "keyframes" in secs:
        _codecs(files, rep, "keyframes" in secs, w)
    if "entropy" in secs:
        rep["entropy"] = _entropy(files)
        print(w, "entropy (fraction of torch.save)", json.dumps(rep["entropy"], indent=1), flush=True)
    if "chunks" in secs:
        rep["chunks"] = _chunks(files)
        print(w, "chunk sizes", rep["chunks"], flush=True)
    if "lossy" in secs:
        rep["lossy"] = _lossy(files)
        print(w, "lossy", rep["lossy"], flush=True)
    if "topology" in secs:
        kf, star, chain, tsize = distance_costs(files, 1, 2 * MIB)
        rep["topology"] = topology_table(kf, star, chain, tsize)
        print(w, "topology", json.dumps(rep["topology"], indent=1), flush=True)
    if "restore" in secs:
        from bench.studies.delta_sizes_bases import accepted_bases
        rep["restore"] = {f"{base}/K={K}": restore_times(files, K, 2 * MIB, base, a.rounds)
                          for base in (bases or accepted_bases()) if base in accepted_bases() for K in (4, 8)}
        print(w, "restore", rep["restore"], flush=True)
    if "write" in secs:
        from bench.studies import delta_sizes_write as write_path
        rep["write"] = write_path.measure(files)
        write_rows.extend(write_path.rows(w, rep["write"]))
        print("\n".join(write_path.HEADER + write_rows), flush=True)
    if "bases" in secs:
        rep["bases"] = compare_bases(files, bases, a.keyframe_interval, 2 * MIB)
        bases_rows += bases_table(w, rep["bases"])
        print("\n".join(BASES_HEADER + bases_rows), flush=True)
    return rep


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", default=None, help="comma-separated (default full,frozen,recsys; quick: full,recsys,gpt2)")
    ap.add_argument("--versions", type=int, default=None, help="versions per workload (default 7, quick 3)")
    ap.add_argument("--cache", default=None,
                    help="keep the trained versions here (.npz, about --versions x the state's size per workload) "
                         "to re-run sections without training; default: a scratch folder removed at exit")
    ap.add_argument("--sections", default=None, help=f"of {ALL_SECTIONS} (default codecs,chunks,lossy,keyframes,restore; quick: all)")
    ap.add_argument("--delta-bases", default=None,
                    help="config delta_base values for the bases and restore sections, comma-separated "
                         "(default: every value the library accepts; a refused one is skipped with a note)")
    ap.add_argument("--keyframe-interval", type=int, default=None, help="bases section: K (default: the library's)")
    ap.add_argument("--out", default=None, help="write the figures to this file")
    ap.add_argument("--record", default=None, metavar="KEY",
                    help="store the figures as run KEY of bench/results/delta_sizes.json")
    ap.add_argument("--rounds", type=int, default=None, help="restore section: loads per version (median; default 2, quick 1)")


def run(a: argparse.Namespace) -> int:
    workloads = (a.workloads or ("full,recsys,gpt2" if a.quick else "full,frozen,recsys")).split(",")
    sections = (a.sections or (ALL_SECTIONS if a.quick else "codecs,chunks,lossy,keyframes,restore")).split(",")
    versions, a.rounds = a.versions or (3 if a.quick else 7), a.rounds or (1 if a.quick else 2)
    report: dict = {}
    bases = a.delta_bases.split(",") if a.delta_bases else None
    bases_rows: list[str] = []
    write_rows: list[str] = []
    with scratch("deltackpt-bench-deltas-", keep=a.cache, parent=a.tmp) as cache:
        for w in workloads:
            files = generate(w, versions, cache, quick=a.quick)
            report[w] = _workload(w, files, sections, a, bases, bases_rows, write_rows)
    if a.quick:
        bad = [w for w, rep in report.items() for x in [rep.get("write", {})] if x and not x["latest_as_saved"]["ok"]]
        assert not bad, f"write section: not bit-identical on {bad}"
        assert all(r["ok"] for rep in report.values() for b in rep.get("bases", {}).values() for r in b.get("reads", [])), \
            "bases section: a read was not bit-identical"
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if a.record:
        print(f"recorded as {a.record} in {record.record('delta_sizes', a.record, report)}")
    return 0
