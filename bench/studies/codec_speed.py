"""Single-thread speed of each lossless codec on real training states, against memcpy measured in
the same run, with what each costs per chunk (Python calls, bytes allocated at peak).

    python -m bench codec_speed --workloads full,frozen,recsys,gpt --cache /tmp/cs_states \
        --alternatives --out /tmp/codec_speed.json
    python -m bench codec_speed --tables /tmp/codec_speed.json      # DELTAS.md's "Speed" tables from a run
    rm -rf /tmp/cs_states

States are the last two cached versions of the delta_sizes study's workloads (``--cache`` as there:
kept where named, else a scratch folder removed at exit).  Keyframes: every 2 MiB chunk of the last
version through bg-zstd.  Deltas: every chunk that changed, through each delta codec against the
previous version's chunk, and through the pipeline's choice.  Throughput is MB of raw chunk bytes
per second of one thread, best of ``--rounds`` passes over the whole set, the passes of all rows
interleaved so that load from other processes hits every row alike (bench/common/timing.py).
``--alternatives`` adds the other libraries (codec_speed_alternatives.py) on the same chunks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import zstandard

from bench.common import record
from bench.common.scratch import scratch
from bench.common.states import generate, tensors
from bench.common.timing import best_sums
from bench.studies.codec_speed_counts import counts
from bench.studies.delta_sizes_sims import chunks, ctx_of
from deltackpt.codecs import pipeline, registry
from deltackpt.codecs.base import ChunkContext
from deltackpt.codecs.registry import BG_ZSTD, SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA, get

SUMMARY = "single-thread encode/decode MB/s and ratio of each codec (and other libraries') on real chunks, against memcpy"
WRITES = "stdout; --out FILE; --record KEY: bench/results/codec_speed.json"

CHUNK = 2 << 20
DELTAS = {"xor-delta": XOR_DELTA, "sub-delta": SUB_DELTA, "scaled-delta": SCALED_DELTA, "sparse": SPARSE}
Item = tuple[bytes, ChunkContext, "bytes | None"]


def chunk_sets(files: list[str]) -> tuple[list[Item], list[Item], int]:
    """(keyframe chunks of the last version, changed chunks of it with their base, torch.save bytes)."""
    prev, _ = tensors(files[-2])
    cur, tsize = tensors(files[-1])
    keys: list[Item] = []
    deltas: list[Item] = []
    for name, arr in cur.items():
        base_arr = prev.get(name)
        for s, raw, row in chunks(arr, CHUNK):
            ctx = ctx_of(arr, row)
            keys.append((raw, ctx, None))
            if base_arr is not None and base_arr.shape == arr.shape:
                b = base_arr.reshape(-1).view(np.uint8)[s:s + len(raw)].tobytes()
                if b != raw:
                    deltas.append((raw, ctx, b))
    return keys, deltas, tsize


def memcpy_rates(rounds: int, mib: int = 256) -> dict[str, float]:
    """GB/s of np.copyto: a 256 MiB buffer (memory to memory) and 2 MiB chunks (cache to cache)."""
    big = np.ones(mib << 20, np.uint8)
    dst = np.empty_like(big)
    small, sdst = big[:CHUNK], np.empty(CHUNK, np.uint8)
    out = {}
    for label, f, n in (("memcpy 256 MiB", lambda: np.copyto(dst, big), big.nbytes),
                        ("memcpy 2 MiB in cache", lambda: [np.copyto(sdst, small) for _ in range(64)], 64 * CHUNK)):
        f()
        out[label] = n / min(_timed(f) for _ in range(rounds)) / 1e9
    return out


def _timed(f: Callable[[], object]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def _rows(items: list[Item], reg, pipe, suffix: str = "") -> dict[str, tuple[Callable, Callable]]:
    """Row name -> (encode one item, decode one encoded item into a destination) for the codecs of
    registry module ``reg`` and pipeline module ``pipe`` (this tree's, or a baseline's copy)."""
    def plain(eid: int) -> tuple[Callable, Callable]:
        codec = reg.get(eid)
        return (lambda r, c, b: codec.encode(r, c, b),
                lambda e, dst, b: codec.decode_into(dst, e.params, e.payload, b))

    def chosen(r: bytes, c: ChunkContext, b: bytes):
        return pipe.encode_chunk(r, c, base=pipe.BaseChunk(b"\0" * 16, b, 0))

    def chosen_dec(e, dst, b) -> None:
        reg.get(e.encoding).decode_into(dst, e.encoded.params, e.encoded.payload, b)
    if items and items[0][2] is None:
        return {"bg-zstd" + suffix: plain(BG_ZSTD)}
    rows = {label + suffix: plain(eid) for label, eid in DELTAS.items()}
    rows["pipeline" + suffix] = (chosen, chosen_dec)
    return rows


def _stored(e) -> int:
    return len(e.encoded.payload) if hasattr(e, "encoded") else len(e.payload)


def measure(items: list[Item], rounds: int, baseline: str | None = None) -> dict[str, dict]:
    """Ratio (stored / raw bytes of the chunks the codec takes), share of chunks it takes, encode
    and decode MB/s of one thread, for each codec row (and the baseline tree's, when given)."""
    rows = _rows(items, registry, pipeline)
    if baseline:
        sys.path.insert(0, baseline)
        import deltackpt_base.codecs.pipeline as bpipe
        import deltackpt_base.codecs.registry as breg
        rows.update(_rows(items, breg, bpipe, " (before)"))
    out = np.empty(max(len(r) for r, _, _ in items), np.uint8)
    live = {}
    for label, (enc, dec) in rows.items():
        taken = [(r, c, b, e) for (r, c, b), e in ((it, enc(*it)) for it in items) if e is not None]
        for r, c, b, e in taken:
            dec(e, memoryview(out[:len(r)]), b)
            assert out[:len(r)].tobytes() == r, label
        raw = sum(len(r) for r, _, _, _ in taken)
        live[label] = (enc, dec, taken, raw, [], [])
    enc_jobs = {k: [(lambda e=enc, i=(r, c, b): e(*i)) for r, c, b, _ in taken]
                for k, (enc, _, taken, _, _, _) in live.items()}
    dec_jobs = {k: [(lambda d=dec, r=r, b=b, e=e: d(e, memoryview(out[:len(r)]), b)) for r, _, b, e in taken]
                for k, (_, dec, taken, _, _, _) in live.items()}
    enc_s, dec_s = best_sums(enc_jobs, rounds), best_sums(dec_jobs, rounds)
    for k, v in live.items():
        v[4].append(enc_s[k])
        v[5].append(dec_s[k])
    total = sum(len(r) for r, _, _ in items)
    return {k: {"ratio": sum(_stored(e) for *_, e in taken) / raw if raw else None, "share": raw / total,
                "encode MB/s": raw / min(es) / 1e6 if raw else None,
                "decode MB/s": raw / min(ds) / 1e6 if raw else None}
            for k, (_, _, taken, raw, es, ds) in live.items()}


def threads(items: list[Item], rounds: int) -> dict[str, float]:
    """Keyframe decode MB/s with 1 and 2 threads, each thread decoding its share into its own buffer."""
    codec = get(BG_ZSTD)
    encoded = [(e.params, bytes(e.payload), len(r)) for (r, c, _), e in ((it, codec.encode(it[0], it[1])) for it in items)]
    raw = sum(n for _, _, n in encoded)

    def part(share: list) -> None:
        out = np.empty(CHUNK, np.uint8)
        for params, payload, n in share:
            codec.decode_into(memoryview(out[:n]), params, payload)
    pools = {nt: ThreadPoolExecutor(nt) for nt in (1, 2)}
    best = {nt: float("inf") for nt in pools}
    try:
        for _ in range(2 * rounds):   # 1 and 2 threads alternate, so both see the same load
            for nt, pool in pools.items():
                t = _timed(lambda: list(pool.map(part, [encoded[i::nt] for i in range(nt)])))
                best[nt] = min(best[nt], t)
    finally:
        for pool in pools.values():
            pool.shutdown()
    return {f"{nt} thread(s) decode MB/s": raw / t / 1e6 for nt, t in best.items()}


def split(items: list[Item], rounds: int) -> dict[str, float]:
    """Where a keyframe's encode and decode time goes: ms per 2 MiB of each stage, one thread."""
    from deltackpt.codecs import bytegroup, native_planes
    from deltackpt.codecs.bytegroup import group_into, width_for
    sets = [(np.frombuffer(r, np.uint8), width_for(c.itemsize, len(r))) for r, c, _ in items if len(r) % 8 == 0]
    encs = [get(BG_ZSTD).encode(r.tobytes(), ChunkContext("x", w, 0)) for r, w in sets]
    work = np.empty(max(len(r) for r, _ in sets), np.uint8)
    out = np.empty_like(work)

    def group(r: np.ndarray, w: int) -> None:
        group_into(r, w, work[:len(r)].reshape(w, -1))

    def decode(r: np.ndarray, e: Any) -> None:
        bytegroup.decode_planes(e.params, e.payload, len(r), what="b", out=out[:len(r)])

    def zstd_only(e: Any) -> None:
        view, pos = memoryview(e.payload), 0
        for mode, size in zip(e.params["m"], e.params["s"]):
            if mode:
                frame = view[pos:pos + size]
                bytegroup.zstd_decompress_into(frame, work[:zstandard.frame_content_size(frame)], what="b")
            pos += size
    codec = get(BG_ZSTD)
    stages = {"encode: group into planes": [(lambda r=r, w=w: group(r, w)) for r, w in sets],
              "encode: whole (group, sample, zstd)": [(lambda r=r, w=w: codec.encode(r, ChunkContext("x", w, 0)))
                                                      for r, w in sets],
              "decode: the library's decoder": [(lambda r=r, e=e: decode(r, e)) for (r, _), e in zip(sets, encs)],
              "decode: zstd of the compressed planes alone": [(lambda e=e: zstd_only(e)) for e in encs],
              "decode: c-blosc's interleave alone (planes framed, unshuffled)": [
                  (lambda r=r, w=w: native_planes.interleave(list(r.reshape(w, -1)), out[:len(r)])) for r, w in sets],
              "memcpy": [(lambda r=r: np.copyto(out[:len(r)], r)) for r, _ in sets]}
    best = best_sums(stages, rounds)
    per = sum(len(r) for r, _ in sets) / CHUNK
    return {k: v / per * 1e3 for k, v in best.items()}


WORKLOADS = ("frozen", "full", "recsys", "gpt", "cnn", "gpt2", "gpt2-bf16")


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
    if not ws:
        return []
    names = list(rep[ws[0]]["alternatives"][sec])
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


def tables(rep: dict) -> str:
    """The markdown tables of DELTAS.md's "Speed" section from one run's figures."""
    parts = (codec_table(rep), alternatives_table(rep, "keyframes"), alternatives_table(rep, "deltas"), threads_table(rep))
    return "\n\n".join("\n".join(p) for p in parts if p)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", default=None, help="comma-separated (default full,frozen,recsys,gpt; quick recsys,gpt2)")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--rounds", type=int, default=None, help="passes per row (best of; default 5, quick 1)")
    ap.add_argument("--alternatives", action="store_true", help="also measure blosc2, numcodecs, zstd variants (quick: always)")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="a folder holding another tree's package renamed deltackpt_base (e.g. main's, made with "
                         "git archive main deltackpt | tar -x -C DIR && mv DIR/deltackpt DIR/deltackpt_base): its "
                         "codecs are measured beside this tree's, interleaved, as rows '... (before)'")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tables", default=None, metavar="FILE", help="print the markdown tables of a run's --out FILE, measure nothing")
    ap.add_argument("--record", default=None, metavar="KEY",
                    help="store the figures as run KEY of bench/results/codec_speed.json")


def run(a: argparse.Namespace) -> int:
    if a.tables:
        with open(a.tables) as f:
            print(tables(json.load(f)))
        return 0
    rounds = a.rounds or (1 if a.quick else 5)
    mib = 32 if a.quick else 256
    report: dict = {"memcpy GB/s": memcpy_rates(rounds, mib)}
    print(json.dumps(report["memcpy GB/s"]), flush=True)
    with scratch("deltackpt-bench-codec-speed-", keep=a.cache, parent=a.tmp) as cache:
        for w in (a.workloads or ("recsys,gpt2" if a.quick else "full,frozen,recsys,gpt")).split(","):
            keys, deltas, tsize = chunk_sets(generate(w, 3, cache, quick=a.quick))
            rep = {"keyframes": measure(keys, rounds, a.baseline), "deltas": measure(deltas, rounds, a.baseline),
                   "threads": threads(keys, rounds), "chunks": [len(keys), len(deltas)],
                   "ms per 2 MiB keyframe": split(keys, rounds)}
            if a.alternatives or a.quick:
                from bench.studies.codec_speed_alternatives import alternatives
                rep["alternatives"] = {"keyframes": alternatives(keys, rounds, 8 if a.quick else 48),
                                       "deltas": alternatives(deltas, rounds, 8 if a.quick else 48)}
            rep["memcpy GB/s"] = memcpy_rates(rounds, mib)
            report[w] = rep
            print(w, json.dumps(rep, indent=1), flush=True)
    report["counts"] = counts()
    print(json.dumps(report["counts"], indent=1))
    print(tables(report))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    if a.record:
        print(f"recorded as {a.record} in {record.record('codec_speed', a.record, report)}")
    return 0
