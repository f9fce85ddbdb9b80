"""Single-thread speed of each lossless codec on real training states, against memcpy measured in
the same run, with what each costs per chunk (Python calls, bytes allocated at peak).

    PYTHONPATH=$PWD python bench/codec_speed.py --workloads full,frozen,recsys,gpt --cache /tmp/cs_states \
        --alternatives --out /tmp/codec_speed.json
    rm -rf /tmp/cs_states

States are the last two cached versions of bench/deltas.py's workloads (``--cache`` as there: kept
where named, else a temp folder removed at exit).  Keyframes: every 2 MiB chunk of the last version
through bg-zstd.  Deltas: every chunk that changed, through each delta codec against the previous
version's chunk, and through the pipeline's choice.  Throughput is MB of raw chunk bytes per second
of one thread, best of ``--rounds`` passes over the whole set, the passes of all rows interleaved so
that load from other processes hits every row alike.  ``--alternatives`` adds the other libraries
(bench/codec_alternatives.py) on the same chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import zstandard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deltackpt.codecs.base import ChunkContext  # noqa: E402
from deltackpt.codecs import pipeline, registry  # noqa: E402
from deltackpt.codecs.registry import BG_ZSTD, SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA, get  # noqa: E402
from bench.codec_counts import counts  # noqa: E402
from bench.codec_timing import best_sums  # noqa: E402
from bench.delta_sims import chunks, ctx_of  # noqa: E402
from bench.deltas import generate  # noqa: E402
from bench.scratch import scratch  # noqa: E402
from bench.topology import tensors  # noqa: E402

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


def memcpy_rates(rounds: int) -> dict[str, float]:
    """GB/s of np.copyto: a 256 MiB buffer (memory to memory) and 2 MiB chunks (cache to cache)."""
    big = np.ones(256 << 20, np.uint8)
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
    from deltackpt.codecs.bytegroup import _choose, _SAMPLE, group_into, width_for
    sets = [(np.frombuffer(r, np.uint8), width_for(c.itemsize, len(r))) for r, c, _ in items if len(r) % 8 == 0]
    encs = [get(BG_ZSTD).encode(r.tobytes(), ChunkContext("x", w, 0)) for r, w in sets]
    work = np.empty(max(len(r) for r, _ in sets), np.uint8)
    out = np.empty_like(work)

    def group(r: np.ndarray, w: int) -> None:
        group_into(r, w, work[:len(r)].reshape(w, -1))

    def sample(r: np.ndarray, w: int) -> None:
        planes = work[:len(r)].reshape(w, -1)
        for k in range(w):
            if planes.shape[1] > 2 * _SAMPLE:
                _choose(memoryview(planes[k])[:_SAMPLE], 1)

    def decode(native: bool) -> Callable[[np.ndarray, Any], None]:
        def run(r: np.ndarray, e: Any) -> None:
            lib = native_planes._blosc
            native_planes._blosc = lib if native else None
            try:
                bytegroup.decode_planes(e.params, e.payload, len(r), what="b", out=out[:len(r)])
            finally:
                native_planes._blosc = lib
        return run
    def zstd_only(e: Any) -> None:
        view, pos = memoryview(e.payload), 0
        for mode, size in zip(e.params["m"], e.params["s"]):
            if mode:
                frame = view[pos:pos + size]
                bytegroup.zstd_decompress_into(frame, work[:zstandard.frame_content_size(frame)], what="b")
            pos += size
    codec = get(BG_ZSTD)
    stages = {"encode: group into planes": [(lambda r=r, w=w: group(r, w)) for r, w in sets],
              "encode: sample each plane": [(lambda r=r, w=w: (group(r, w), sample(r, w))) for r, w in sets],
              "encode: whole (group, sample, zstd)": [(lambda r=r, w=w: codec.encode(r, ChunkContext("x", w, 0)))
                                                      for r, w in sets],
              "decode: numpy + python-zstandard": [(lambda r=r, e=e: decode(False)(r, e)) for (r, _), e in zip(sets, encs)],
              "decode: c-blosc": [(lambda r=r, e=e: decode(True)(r, e)) for (r, _), e in zip(sets, encs)],
              "decode: zstd of the compressed planes alone": [(lambda e=e: zstd_only(e)) for e in encs],
              "decode: c-blosc's interleave alone (planes framed, unshuffled)": [
                  (lambda r=r, w=w: native_planes.interleave(list(r.reshape(w, -1)), out[:len(r)])) for r, w in sets],
              "memcpy": [(lambda r=r: np.copyto(out[:len(r)], r)) for r, _ in sets]}
    best = best_sums(stages, rounds)
    per = sum(len(r) for r, _ in sets) / CHUNK
    return {k: v / per * 1e3 for k, v in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="full,frozen,recsys,gpt")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--alternatives", action="store_true", help="also measure blosc2, numcodecs, zstd variants")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="a folder holding another tree's package renamed deltackpt_base (e.g. main's, made with "
                         "git archive main deltackpt | tar -x -C DIR && mv DIR/deltackpt DIR/deltackpt_base): its "
                         "codecs are measured beside this tree's, interleaved, as rows '... (before)'")
    ap.add_argument("--out", default=None)
    ap.add_argument("--record", default=None, metavar="KEY",
                    help="store the figures as run KEY of bench/results/deltas.json (the data behind DELTAS.md)")
    a = ap.parse_args()
    report: dict = {"memcpy GB/s": memcpy_rates(a.rounds)}
    print(json.dumps(report["memcpy GB/s"]), flush=True)
    with scratch("codec-speed-", keep=a.cache) as cache:
        for w in a.workloads.split(","):
            keys, deltas, tsize = chunk_sets(generate(w, 3, cache))
            rep = {"keyframes": measure(keys, a.rounds, a.baseline), "deltas": measure(deltas, a.rounds, a.baseline),
                   "threads": threads(keys, a.rounds), "chunks": [len(keys), len(deltas)],
                   "ms per 2 MiB keyframe": split(keys, a.rounds)}
            if a.alternatives:
                from bench.codec_alternatives import alternatives
                rep["alternatives"] = {"keyframes": alternatives(keys, a.rounds),
                                       "deltas": alternatives(deltas, a.rounds)}
            rep["memcpy GB/s"] = memcpy_rates(a.rounds)
            report[w] = rep
            print(w, json.dumps(rep, indent=1), flush=True)
    report["counts"] = counts()
    print(json.dumps(report["counts"], indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    if a.record:
        from bench import record
        print(f"recorded as {a.record} in {record.record('deltas', a.record, report)}")


if __name__ == "__main__":
    main()
