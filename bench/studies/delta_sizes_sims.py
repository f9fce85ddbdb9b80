"""Simulations over the delta_sizes study's cached states that need no repository: order-0 entropy
bounds per tensor kind, and what a star or two-level topology would pay by distance from its
keyframe.  Also the chunking helpers both modules share."""

from __future__ import annotations

import statistics

import numpy as np

from bench.common.states import tensors
from deltackpt.codecs.base import ChunkContext
from deltackpt.codecs.pipeline import BaseChunk, encode_chunk

DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "int16": "bfloat16",
          "int64": "int64", "int32": "int32", "uint8": "uint8", "bool": "bool"}


def kind(name: str) -> str:
    if name.endswith("exp_avg"):
        return "exp_avg"
    if name.endswith("exp_avg_sq"):
        return "exp_avg_sq"
    return "weights" if name.startswith("model") else "other"


def chunks(arr: np.ndarray, chunk_bytes: int):
    raw = arr.reshape(-1).view(np.uint8)
    row = arr.strides[0] if arr.ndim > 1 else arr.itemsize
    step = max(row, chunk_bytes // row * row) if row else chunk_bytes
    for s in range(0, max(len(raw), 1), step):
        yield s, raw[s:s + step].tobytes(), row


def ctx_of(arr: np.ndarray, row: int) -> ChunkContext:
    return ChunkContext(DTYPES.get(str(arr.dtype), "uint8"), arr.itemsize, row)


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
