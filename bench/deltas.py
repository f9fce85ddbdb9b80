"""How many bytes each new version costs, per codec, per tensor kind, lossy or not, by chunk size and
keyframe interval, and how long restoring the deepest version of a chain takes.

    PYTHONPATH=. python bench/deltas.py --workloads full,frozen,recsys --versions 7 --out bench/deltas.json

States come from the real training runs of bench/workloads.py
and are cached as .npz under --cache, so the codec passes can be re-run without training again.
Every ratio is bytes / torch.save bytes of the same state; "median" is over versions after the first.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deltackpt.codecs.base import ChunkContext  # noqa: E402
from deltackpt.codecs.pipeline import BaseChunk, encode_chunk  # noqa: E402
from deltackpt.codecs.registry import (BG_ZSTD, SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA,  # noqa: E402
                                       get)

MIB = 1 << 20
SETS = {"keyframe": (BG_ZSTD,), "xor": (XOR_DELTA,), "sub": (SUB_DELTA,), "scaled": (SCALED_DELTA,),
        "sparse": (SPARSE,), "pipeline": None}
DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "int16": "bfloat16",
          "int64": "int64", "int32": "int32", "uint8": "uint8", "bool": "bool"}


def kind(name: str) -> str:
    if name.endswith("exp_avg"):
        return "exp_avg"
    if name.endswith("exp_avg_sq"):
        return "exp_avg_sq"
    return "weights" if name.startswith("model") else "other"


def generate(name: str, versions: int, cache: str) -> list[str]:
    """Train the workload and cache each version's tensors (bf16 stored as int16 bit patterns)."""
    out = os.path.join(cache, name)
    files = sorted(glob.glob(os.path.join(out, "v*.npz")))
    if len(files) >= versions:
        return files[:versions]
    import torch
    from bench import workloads as wl
    states = {"full": lambda: wl.minilm(versions), "frozen": lambda: wl.minilm(versions, frozen=True),
              "recsys": lambda: wl.recsys(versions)}[name]()
    gen = ((state["step"], state) for state in states)
    os.makedirs(out, exist_ok=True)

    def flat(prefix, obj, d):
        if isinstance(obj, torch.Tensor):
            t = obj.detach().contiguous()
            d[prefix] = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().copy()
        elif isinstance(obj, dict):
            for k, v in obj.items():
                flat(f"{prefix}.{k}" if prefix else str(k), v, d)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                flat(f"{prefix}.{i}", v, d)
    for step, state in gen:
        d: dict = {}
        flat("", state, d)
        buf = io.BytesIO()
        torch.save(state, buf)
        np.savez(os.path.join(out, f"v{step:06d}.npz"), **d)
        with open(os.path.join(out, f"v{step:06d}.tsize"), "w") as f:
            f.write(str(len(buf.getvalue())))
    return sorted(glob.glob(os.path.join(out, "v*.npz")))[:versions]


def tensors(path: str) -> tuple[dict[str, np.ndarray], int]:
    z = np.load(path)
    return {k: z[k] for k in z.files}, int(open(path[:-4] + ".tsize").read())


def chunks(arr: np.ndarray, chunk_bytes: int):
    raw = arr.reshape(-1).view(np.uint8)
    row = arr.strides[0] if arr.ndim > 1 else arr.itemsize
    step = max(row, chunk_bytes // row * row) if row else chunk_bytes
    for s in range(0, max(len(raw), 1), step):
        yield s, raw[s:s + step].tobytes(), row


def ctx_of(arr: np.ndarray, row: int) -> ChunkContext:
    return ChunkContext(DTYPES.get(str(arr.dtype), "uint8"), arr.itemsize, row)


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


def _plane_entropy_bytes(u8: np.ndarray, width: int) -> float:
    """Sum over byte planes of n * H0(plane) / 8: what an ideal memoryless coder per plane would need."""
    planes = u8.reshape(-1, width).T
    total = 0.0
    for p in planes:
        counts = np.bincount(p, minlength=256).astype(np.float64)
        prob = counts[counts > 0] / len(p)
        total += -(prob * np.log2(prob)).sum() * len(p) / 8
    return total


def _h2(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else float(-(p * np.log2(p) + (1 - p) * np.log2(1 - p)))


def _zigzag32(d: np.ndarray) -> np.ndarray:
    """Zigzag of a uint32 wrapping difference, as sub-delta stores it (0, -1, 1, -2 -> 0, 1, 2, 3)."""
    return (d << 1) ^ (d.view(np.int32) >> 31).view(np.uint32)


def entropy_pass(prev: dict, cur: dict) -> dict:
    """Per tensor kind: order-0 byte-plane entropy of the value itself, of the XOR and of the zigzag
    integer delta (the smallest per tensor is what a per-plane entropy coder could reach), and the
    fraction of rows that changed at all."""
    out: dict = {}
    for name, arr in cur.items():
        base = prev.get(name)
        if arr.dtype != np.float32 or base is None or base.shape != arr.shape or arr.size < 1024:
            continue
        k = kind(name)
        a, b = arr.reshape(-1).view(np.uint32), base.reshape(-1).view(np.uint32)
        if np.array_equal(a, b):
            out[(k, "raw")] = out.get((k, "raw"), 0) + arr.nbytes
            continue
        with np.errstate(over="ignore"):
            cands = {"value": a, "xor": a ^ b, "sub": _zigzag32(a - b)}
        h = {c: _plane_entropy_bytes(v.view(np.uint8), 4) for c, v in cands.items()}
        h["best"] = min(h.values())
        rows = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
        changed_rows = (rows != base.reshape(rows.shape)).any(axis=1)
        mask = np.repeat(changed_rows, rows.shape[1])
        if not mask.all():  # sparse update: the entropy of the changed rows alone, plus a row bitmap
            bitmap = len(changed_rows) / 8 * _h2(changed_rows.mean())
            h["changed_rows_best"] = bitmap + min(_plane_entropy_bytes(np.ascontiguousarray(v[mask]).view(np.uint8), 4)
                                                  for v in cands.values())
        else:
            h["changed_rows_best"] = h["best"]
        for c, v in h.items():
            out[(k, c)] = out.get((k, c), 0) + v
        out[(k, "raw")] = out.get((k, "raw"), 0) + arr.nbytes
        out[(k, "changed_row_bytes")] = out.get((k, "changed_row_bytes"), 0) + int(changed_rows.sum()) * rows.shape[1] * 4
    return out


def _delta_bytes(raw: bytes, ctx: ChunkContext, base: bytes | None) -> int:
    bc = BaseChunk(b"\0" * 16, base, 0) if base is not None and len(base) == len(raw) else None
    return len(encode_chunk(raw, ctx, base=bc, keyframe_interval=1 << 20).encoded.payload) + 40


def distance_costs(files: list[str], first: int, chunk_bytes: int) -> tuple[int, list[int], list[int], int]:
    """Lossless pipeline bytes of version first+d stored against version ``first`` (a keyframe at
    depth 0), for every d after it: what a star topology pays at distance d.  A chunk equal to the
    one in the version before it costs 0 (deduplicated), as it would in a repository.  Also returns
    the keyframe bytes (bg-zstd) of the chunks that changed and, for comparison, the bytes of each
    version against its parent (a parent chain)."""
    base, tsize = tensors(files[first])
    prev = base
    star, chain = [], []
    kf = 0
    by_kind: dict = {}
    for d, f in enumerate(files[first + 1:], 1):
        cur, tsize = tensors(f)
        total = total_chain = 0
        for name, arr in cur.items():
            b_arr, p_arr = base.get(name), prev.get(name)
            for s, raw, row in chunks(arr, chunk_bytes):
                ctx = ctx_of(arr, row)
                p = p_arr.reshape(-1).view(np.uint8)[s:s + len(raw)].tobytes() if p_arr is not None else None
                if p == raw:
                    continue
                b = b_arr.reshape(-1).view(np.uint8)[s:s + len(raw)].tobytes() if b_arr is not None else None
                first_delta = f == files[first + 1]
                if first_delta:
                    kf += len(encode_chunk(raw, ctx).encoded.payload) + 40
                n = _delta_bytes(raw, ctx, b)
                nc = n if first_delta else _delta_bytes(raw, ctx, p)
                total += n
                total_chain += nc
                k = by_kind.setdefault(kind(name), {"star": [0] * (len(files) - first - 1),
                                                    "chain": [0] * (len(files) - first - 1)})
                k["star"][d - 1] += n
                k["chain"][d - 1] += nc
        star.append(total)
        chain.append(total_chain)
        prev = cur
    print("by kind (fraction of torch.save): star by distance / parent chain", flush=True)
    for k, v in by_kind.items():
        print(f"  {k:10s} star  " + " ".join(f"{x / tsize:.3f}" for x in v["star"]))
        print(f"  {k:10s} chain " + " ".join(f"{x / tsize:.3f}" for x in v["chain"]), flush=True)
    return kf, star, chain, tsize


def topology_table(kf: int, star: list[int], chain: list[int], tsize: int) -> dict:
    """Amortized bytes per version over a cycle (a keyframe of the changed chunks, then K versions)
    for parent chains (depth <= K), a star (every version against the keyframe: depth <= 1) and a
    two-level scheme (every M-th version against the keyframe, the others against it: depth <= 2)."""
    link = statistics.median(chain)
    out: dict = {}
    for K in (1, 2, 4, 8, 16):
        if K > len(star):
            continue
        out[f"chain/K={K}"] = (kf + K * link) / (K + 1) / tsize
        out[f"star/K={K}"] = (kf + sum(star[:K])) / (K + 1) / tsize
        for M in (2, 4):
            if M >= K:
                continue
            # mids at d = M, 2M, ... cost star[d-1]; a version j past its mid costs about star[j-1]
            cost = sum(star[d - 1] if d % M == 0 else star[d % M - 1] for d in range(1, K + 1))
            out[f"two-level(M={M})/K={K}"] = (kf + cost) / (K + 1) / tsize
    out["star_by_distance"] = [n / tsize for n in star]
    out["chain_per_version"] = [n / tsize for n in chain]
    out["keyframe"] = kf / tsize
    return out


def median_after_first(xs: list[float]) -> float:
    return statistics.median(xs[1:]) if len(xs) > 1 else float("nan")


def restore_times(files: list[str], k: int, chunk_bytes: int, delta_base: str = "parent",
                  rounds: int = 2) -> list[dict]:
    """Save every version into a real repository with keyframe interval k (and ``delta_base``);
    time loading each one from a fresh handle (the median of ``rounds``, versions interleaved)."""
    import torch

    import deltackpt
    from deltackpt.frontend import api
    res = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("DELTAS_TMP")) as tmp:
        repo = os.path.join(tmp, "repo")
        deltackpt.Repo.init(repo, keyframe_interval=k, chunk_bytes=chunk_bytes, delta_base=delta_base)
        vids = []
        for f in files:
            cur, tsize = tensors(f)
            state = {n: torch.from_numpy(a) for n, a in cur.items()}
            t0 = time.perf_counter()
            v = deltackpt.save(state, repo)
            vids.append((v, time.perf_counter() - t0, tsize))
        api._OPEN.clear()
        r = deltackpt.Repo(repo)
        index = r.core
        depths = {}
        for (v, _save_s, _tsize) in vids:
            m = index.manifest(v.id)
            depths[v.id] = max(index.entry(c.chunk_id)[1].depth for b in m.blobs for c in b.chunks)
        times: dict = {v.id: [] for v, _, _ in vids}
        for _ in range(rounds):
            for (v, _save_s, _tsize) in vids:
                api._OPEN.clear()  # a new process: nothing decoded in memory
                t0 = time.perf_counter()
                deltackpt.load(repo, v.id)
                times[v.id].append(time.perf_counter() - t0)
        for (v, save_s, tsize) in vids:
            res.append({"version": v.id[:10], "depth": depths[v.id], "load_s": statistics.median(times[v.id]),
                        "save_s": save_s, "written_ratio": v.written_bytes / tsize})
        api._OPEN.clear()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="full,frozen,recsys")
    ap.add_argument("--versions", type=int, default=7)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "deltas_states"))
    ap.add_argument("--sections", default="codecs,chunks,lossy,keyframes,restore")  # also: topology, entropy
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=2, help="restore section: loads per version (median)")
    a = ap.parse_args()
    report: dict = {}
    for w in a.workloads.split(","):
        files = generate(w, a.versions, a.cache)
        rep = report[w] = {}
        secs = a.sections.split(",")
        if "codecs" in secs or "keyframes" in secs:
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
            if "keyframes" in secs:
                # a cycle is one keyframe of the chunks that changed, then K deltas (depth <= K);
                # unchanged chunks are reused whatever K is
                delta = statistics.median(r["bytes"][("pipeline", "all")] for r, _ in per)
                kf = statistics.median(r["bytes"][("keyframe", "all")] for r, _ in per)
                tsize = per[0][1]
                rep["keyframes_bytes"] = {K: (kf + K * delta) / (K + 1) / tsize for K in (4, 8, 16, 32)}
                print(w, "amortized bytes by K", rep["keyframes_bytes"], flush=True)
        if "entropy" in secs:
            a0, _ = tensors(files[-2])
            a1, tsize = tensors(files[-1])
            e = entropy_pass(a0, a1)
            res = {f"{k}/{c}": v / tsize for (k, c), v in e.items()}
            res["all/best"] = sum(v for (k, c), v in e.items() if c == "best") / tsize
            res["all/changed_rows_best"] = sum(v for (k, c), v in e.items() if c == "changed_rows_best") / tsize
            rep["entropy"] = res
            print(w, "entropy (fraction of torch.save)", json.dumps(res, indent=1), flush=True)
        if "chunks" in secs:
            res = {}
            a0, _ = tensors(files[-2])
            a1, tsize = tensors(files[-1])
            for cb in (1, 2, 4):
                r = lossless_pass(a0, a1, cb * MIB, {"pipeline": None})
                res[f"{cb}MiB"] = {"ratio": r["bytes"][("pipeline", "all")] / tsize,
                                   "MBps": r["bytes"][("raw", "all")] / 1e6 / r["seconds"]["pipeline"]}
            rep["chunks"] = res
            print(w, "chunk sizes", res, flush=True)
        if "lossy" in secs:
            res = {}
            for label, modes in {"q8-optimizer": {"exp_avg": "q8-delta", "exp_avg_sq": "q8-delta"},
                                 "q8-all": {"exp_avg": "q8-delta", "exp_avg_sq": "q8-delta", "weights": "q8-delta"},
                                 "q4-optimizer": {"exp_avg": "q4-delta", "exp_avg_sq": "q4-delta"},
                                 "q4-all": {"exp_avg": "q4-delta", "exp_avg_sq": "q4-delta", "weights": "q4-delta"},
                                 "q8-weights-q4-optimizer": {"exp_avg": "q4-delta", "exp_avg_sq": "q4-delta",
                                                             "weights": "q8-delta"}}.items():
                chain = lossy_chain(files, modes, 2 * MIB, 64)
                res[label] = {"median": median_after_first([c["ratio"] for c in chain]),
                              "max_abs_err": max(c["max_abs_err"] for c in chain)}
            rep["lossy"] = res
            print(w, "lossy", res, flush=True)
        if "topology" in secs:
            kf, star, chain, tsize = distance_costs(files, 1, 2 * MIB)
            rep["topology"] = topology_table(kf, star, chain, tsize)
            print(w, "topology", json.dumps(rep["topology"], indent=1), flush=True)
        if "restore" in secs:
            rep["restore"] = {f"{base}/K={K}": restore_times(files, K, 2 * MIB, base, a.rounds)
                              for base in ("parent", "keyframe") for K in (4, 8)}
            print(w, "restore", rep["restore"], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
