"""Regenerate the golden test vectors in this folder (deterministic: fixed inputs, times and ids).

    PYTHONPATH=. python spec/vectors/make_vectors.py

Every vector is a JSON file of hex strings; tests/format/test_vectors.py decodes each with the
current code and re-encodes the deterministic ones, so a change that alters bytes fails.  Only
regenerate on purpose, for a new format version, and say so in spec/FORMAT.md "Changes".
"""

from __future__ import annotations

import json
import os
import struct
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import zstandard

from deltackpt.codecs import registry
from deltackpt.codecs.base import ChunkContext
from deltackpt.format import config as config_fmt
from deltackpt.format import events as events_fmt
from deltackpt.format import index as index_fmt
from deltackpt.format import objects, refs
from deltackpt.format.ids import digest, hex_id
from deltackpt.format.manifest import Blob, ChunkRef, Manifest, TensorEntry, TensorRef
from deltackpt.format.pack import PackBuilder

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_TIME = 1767225600.0          # 2026-01-01T00:00:00Z
FIXED_REPO_ID = "00112233445566778899aabbccddeeff"


def jsonish(value: Any) -> Any:
    """msgpack values -> JSON: bytes as {"bin": hex}, tuples as {"tuple": [...]}, tensor refs as
    {"tensor": i}, maps as {"map": [[k, v], ...]} (keys may be ints), floats that JSON cannot hold
    as {"float": "nan"|"inf"|"-inf"}."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bin": bytes(value).hex()}
    if isinstance(value, TensorRef):
        return {"tensor": value.index}
    if isinstance(value, tuple):
        return {"tuple": [jsonish(v) for v in value]}
    if isinstance(value, list):
        return [jsonish(v) for v in value]
    if isinstance(value, dict):
        return {"map": [[jsonish(k), jsonish(v)] for k, v in value.items()]}
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return {"float": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    return value


def f32(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def codec_case(name: str, raw: bytes, dtype: str, itemsize: int, row_bytes: int,
               base: bytes | None = None, note: str = "") -> dict:
    codec = registry.by_name(name)
    ctx = ChunkContext(dtype, itemsize, row_bytes, 1)
    enc = codec.encode(raw, ctx, base)
    assert enc is not None, name
    params = dict(enc.params)
    base_id = digest(base) if codec.needs_base else None
    if base_id is not None:
        params["base"] = base_id  # the saver adds the base chunk id to every delta's parameters
    obj = objects.EncodedObject(codec.encoding_id, len(raw), params, bytes(enc.payload)).to_bytes()
    decoded = bytes(codec.decode(objects.parse(obj).params, bytes(objects.parse(obj).payload), len(raw), base))
    expect = raw if enc.recon is None else bytes(enc.recon)
    assert decoded == expect, name
    return {"codec": name, "encoding": codec.encoding_id, "lossless": codec.lossless, "note": note,
            "dtype": dtype, "itemsize": itemsize, "row_bytes": row_bytes, "zstd_level": 1,
            "input": raw.hex(), "base": None if base is None else base.hex(),
            "base_id": None if base_id is None else base_id.hex(),
            "params": jsonish(params), "object": obj.hex(), "decoded": decoded.hex(),
            "chunk_id": digest(decoded).hex(), "max_abs_err": enc.max_abs_err}


def codec_vectors() -> dict[str, list[dict]]:
    x = _codec_inputs()
    return {**_scaled_quant_cases(x), **_lossless_cases(x), **_quant_cases(x), **_cast_cases(x)}


def _codec_inputs() -> SimpleNamespace:
    """Every codec vector's input arrays, drawn from one seeded generator in a fixed order (so the
    committed vectors stay byte for byte what they are)."""
    rng = np.random.default_rng(1234)
    specials = f32([1.0, -0.0, 0.0, 1e-45, -2.5]) + struct.pack("<I", 0x7FC01234)  # subnormal, NaN payload
    smooth = (np.linspace(0.5, 0.75, 64, dtype=np.float32)).astype("<f4")
    base32 = (rng.standard_normal(64) * 0.1).astype("<f4")
    moved = (base32 + rng.standard_normal(64).astype("<f4") * 1e-4).astype("<f4")
    ints = np.arange(0, 32, dtype="<i8") * 1000
    ints_new = ints + np.array([(-1) ** i * (i % 5) for i in range(32)], dtype="<i8")
    table = (rng.standard_normal((8, 4)) * 0.02).astype("<f4")
    table_new = table.copy()
    table_new[5] += np.float32(0.5)
    qbase = (rng.standard_normal(300) * 0.05).astype("<f4")
    qnew = (qbase + rng.standard_normal(300).astype("<f4") * 0.01).astype("<f4")
    casts = np.array([1.0, 1.00048828125, 1.0009765625, 3.140625, -0.333333, 65504.0, 1e-8, 0.0], dtype="<f4")
    ties = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -126, 3.3895313892515355e38], dtype="<f4")
    f64 = np.array([1 + 2 ** -8 + 2 ** -30, 0.1, -1e300 * 0 - 2.5], dtype="<f8")
    bf_base = (rng.standard_normal(40) * 0.1).astype("<f4")
    bf_base16 = (bf_base.view("<u4") >> 16).astype("<u2")
    bf_new16 = ((bf_base + rng.standard_normal(40).astype("<f4") * 0.01).view("<u4") >> 16).astype("<u2")
    h_base = (rng.standard_normal(40) * 0.1).astype("<f2")
    h_new = (h_base + (rng.standard_normal(40) * 0.01).astype("<f2")).astype("<f2")
    f32_base = (rng.standard_normal(16)).astype("<f4")
    f32_new = np.nextafter(f32_base, np.float32(np.inf)).astype("<f4")
    adam_base = (np.abs(rng.standard_normal(256)) * 1e-3).astype("<f4")
    adam_new = (adam_base.astype(np.float64) * 0.9).astype("<f4")
    adam_new[::7] += np.float32(1e-6)  # a few elements also got a gradient
    sbase = (rng.standard_normal(300) * 0.05).astype("<f4")
    snew = (sbase.astype(np.float64) * 0.9 ** 20).astype("<f4")  # an untouched Adam exp_avg, 20 steps on
    snew[:256:13] = (rng.standard_normal(20) * 0.05).astype("<f4")  # these got a gradient; block 2 did not
    sb_base = (rng.standard_normal(300) * 0.1).astype("<f4")
    sb_new = (sb_base.astype(np.float64) * 0.9).astype("<f4")
    sb_new[::7] += (rng.standard_normal(43) * 0.01).astype("<f4")
    sb_base16, sb_new16 = ((x.view("<u4") >> 16).astype("<u2") for x in (sb_base, sb_new))
    sh_base = (rng.standard_normal(300) * 0.1).astype("<f2")
    sh_new = (sh_base.astype(np.float64) * 0.9).astype("<f2")
    sh_new[::7] = (rng.standard_normal(43) * 0.1).astype("<f2")
    nan32 = np.array([0x7F800001, 0x7FC01234, 0xFF812345, 0x7F800000, 0xFF800000, 0x3F800000], dtype="<u4")
    nan64 = np.array([0x7FF0000000000001, 0xFFF4000012345678, 0x7FF8000000000000, 0xFFF0000000000000],
                     dtype="<u8")
    nan_base = np.linspace(1e-3, 2e-3, 256, dtype=np.float32).astype("<f4")
    nan_new = (nan_base.astype(np.float64) * 0.9).astype("<f4")
    nan_base.view("<u4")[[5, 9]] = [0x7F800001, 0xFF812345]    # a signaling NaN and a negative one with a payload
    nan_new.view("<u4")[[5, 9]] = [0x7F800001, 0x3F800000]     # the same NaN again; 1.0
    return SimpleNamespace(
        specials=specials, smooth=smooth, base32=base32, moved=moved, ints=ints, ints_new=ints_new,
        table=table, table_new=table_new, qbase=qbase, qnew=qnew, casts=casts, ties=ties, f64=f64,
        bf_base=bf_base, bf_base16=bf_base16, bf_new16=bf_new16, h_base=h_base, h_new=h_new,
        f32_base=f32_base, f32_new=f32_new, adam_base=adam_base, adam_new=adam_new, sbase=sbase, snew=snew,
        sb_base=sb_base, sb_new=sb_new, sb_base16=sb_base16, sb_new16=sb_new16, sh_base=sh_base,
        sh_new=sh_new, nan32=nan32, nan64=nan64, nan_base=nan_base, nan_new=nan_new)


def _scaled_quant_cases(x: SimpleNamespace) -> dict[str, list[dict]]:
    """Lossy deltas against a scaled base (decaying optimizer moments)."""
    return {
        "q8-scaled-delta": [codec_case("q8-scaled-delta", x.snew.tobytes(), "float32", 4, 4, x.sbase.tobytes(),
                                       note="300 float32 decayed by 0.9**20 (a decaying chunk: value-relative step floor), every 13th of block 1 new; block 2's codes are all 0, so its scale is 0"),
                            codec_case("q8-scaled-delta", x.sb_new16.tobytes(), "bfloat16", 2, 2, x.sb_base16.tobytes(),
                                       note="bfloat16, decayed by 0.9 (signed, so not a decaying chunk: rms floor only): alpha*base in float64 rounded to float32, float32 arithmetic, result rounded to bfloat16")],
        "q4-scaled-delta": [codec_case("q4-scaled-delta", x.snew.tobytes(), "float32", 4, 4, x.sbase.tobytes(),
                                       note="the q8-scaled-delta input: nibbles low-first, block 2 all zero"),
                            codec_case("q4-scaled-delta", x.sh_new.tobytes(), "float16", 2, 2, x.sh_base.tobytes(),
                                       note="float16: float32 arithmetic, result rounded to float16 (nearest even)")],
    }


def _lossless_cases(x: SimpleNamespace) -> dict[str, list[dict]]:
    """The lossless codecs: keyframes and exact deltas."""
    return {
        "raw": [codec_case("raw", x.specials, "float32", 4, 4, note="-0.0, a subnormal and a NaN with payload 0x7fc01234 kept bit for bit")],
        "bg-zstd": [codec_case("bg-zstd", x.smooth.tobytes(), "float32", 4, 4,
                               note="64 float32: high planes compress (mode 1), low mantissa plane stays raw (mode 0)")],
        "xor-delta": [codec_case("xor-delta", x.moved.tobytes(), "float32", 4, 4, x.base32.tobytes())],
        "sub-delta": [codec_case("sub-delta", x.ints_new.tobytes(), "int64", 8, 8, x.ints.tobytes(),
                                 note="deltas -4..4 zigzag to 0..8"),
                      codec_case("sub-delta", x.f32_new.tobytes(), "float32", 4, 4, x.f32_base.tobytes(),
                                 note="each float32 moved to its next value up: bit-pattern delta +1 or -1")],
        "scaled-delta": [codec_case("scaled-delta", x.adam_new.tobytes(), "float32", 4, 4, x.adam_base.tobytes(),
                                    note="256 float32 that decayed by 0.9 (an Adam moment with no gradient), every 7th also moved: residuals 0 except those"),
                         codec_case("scaled-delta", x.nan_new.tobytes(), "float32", 4, 4, x.nan_base.tobytes(),
                                    note="NaN in the base: the prediction is the base NaN with the quiet bit set (payload and sign kept), so element 5 (new = the base's signaling NaN 0x7f800001) has residual -0x400000, not 0")],
        "sparse": [codec_case("sparse", x.table_new.tobytes(), "float32", 4, 16, x.table.tobytes(),
                              note="8 rows of 16 bytes, row 5 changed")],
    }


def _quant_cases(x: SimpleNamespace) -> dict[str, list[dict]]:
    """Lossy block-quantized deltas against the base as it is."""
    return {
        "q8-delta": [codec_case("q8-delta", x.qnew.tobytes(), "float32", 4, 4, x.qbase.tobytes(),
                                note="300 elements: two blocks of 256, the second padded"),
                     codec_case("q8-delta", x.bf_new16.tobytes(), "bfloat16", 2, 2, x.bf_base16.tobytes(),
                                note="bfloat16: float32 arithmetic, result rounded to bfloat16 (nearest even)")],
        "q4-delta": [codec_case("q4-delta", x.qnew.tobytes(), "float32", 4, 4, x.qbase.tobytes(),
                                note="300 elements: two blocks of 256, nibbles low-first"),
                     codec_case("q4-delta", x.h_new.tobytes(), "float16", 2, 2, x.h_base.tobytes(),
                                note="float16: float32 arithmetic, result rounded to float16 (nearest even)")],
    }


def _cast_cases(x: SimpleNamespace) -> dict[str, list[dict]]:
    """Lossy casts to 16-bit floats, NaNs and rounding ties included."""
    return {
        "fp16": [codec_case("fp16", x.casts.tobytes(), "float32", 4, 4, note="round to nearest even; 65504 is fp16 max"),
                 codec_case("fp16", x.f64.tobytes(), "float64", 8, 8, note="float64 source: one rounding to float16"),
                 codec_case("fp16", x.nan32.tobytes(), "float32", 4, 4,
                            note="NaNs: H = sign|0x7c00|top 10 mantissa bits (0x7c01 when those are 0); decoded to float32 bit for bit (p << 13): a signaling NaN stays signaling"),
                 codec_case("fp16", x.nan64.tobytes(), "float64", 8, 8,
                            note="NaNs from float64: decoded through float32, whose widening to float64 sets the quiet bit: 0x7c01 -> 0x7ff8040000000000")],
        "bf16": [codec_case("bf16", x.casts.tobytes(), "float32", 4, 4, note="round to nearest even on the upper 16 bits"),
                 codec_case("bf16", x.ties.tobytes(), "float32", 4, 4,
                            note="ties: 1+2^-8 -> 1.0 (even), 1+3*2^-8 -> 1+2^-6 (even), the smallest normal and the largest finite bfloat16 stay"),
                 codec_case("bf16", x.f64.tobytes(), "float64", 8, 8,
                            note="float64 source: rounded to float32 first, then to bfloat16: 1+2^-8+2^-30 -> 1+2^-8 (float32) -> 1.0 (tie to even); one rounding would give 1+2^-7"),
                 codec_case("bf16", x.nan32.tobytes(), "float32", 4, 4,
                            note="NaNs: the encoder sets the quiet bit (0x7f800001 -> 0x7fc0, 0xff812345 -> 0xffc1); decoded bit for bit (H << 16)"),
                 codec_case("bf16", x.nan64.tobytes(), "float64", 8, 8,
                            note="NaNs from float64: rounded to float32 (IEEE: quiet bit set, top 23 payload bits kept), then as from float32")],
    }


def pack_vector(cases: dict[str, list[dict]]) -> dict:
    builder = PackBuilder()
    chosen = [cases["raw"][0], cases["bg-zstd"][0], cases["xor-delta"][0]]
    entries = []
    for c in chosen:
        obj = bytes.fromhex(c["object"])
        parsed = objects.parse(obj)
        base = parsed.params.get("base")
        e = builder.add(bytes.fromhex(c["chunk_id"]), obj, encoding=parsed.encoding, raw_len=parsed.raw_len,
                        base=base, depth=1 if base else 0)
        entries.append([e.chunk_id.hex(), e.offset, e.length, e.encoding, e.raw_len,
                        None if e.base is None else e.base.hex(), e.depth])
    data = builder.finish()
    return {"objects_from": [c["codec"] for c in chosen], "pack": data.hex(), "pack_id": hex_id(data),
            "entries": entries}


def index_vector(pack: dict, version: int = 1) -> dict:
    from deltackpt.format.pack import parse_pack
    data = bytes.fromhex(pack["pack"])
    body = {pack["pack_id"]: (len(data), parse_pack(data))}
    idx = index_fmt.encode(body, version)
    return {"index": idx.hex(), "key": "index/" + hex_id(idx), "pack_id": pack["pack_id"], "pack_len": len(data),
            "entries": pack["entries"]}


def manifest_vector() -> dict:
    a = bytes.fromhex("00" * 15 + "01")
    b = bytes.fromhex("00" * 15 + "02")
    c = bytes.fromhex("00" * 15 + "03")
    blobs = [
        Blob(24, 4, 12, [ChunkRef(a, 24)]),             # a [2, 3] float32
        Blob(2, 2, 2, [ChunkRef(b, 2)]),                # a 0-d bfloat16
        Blob(0, 8, 8, []),                              # an empty int64 [0, 5]
        Blob(16, 4, 4, [ChunkRef(c, 16)]),              # one storage shared by two tensors (tied)
    ]
    tensors = [
        TensorEntry("model.w", ["model", "w"], "float32", [2, 3], [3, 1], 0, 0),
        TensorEntry("model.scale", ["model", "scale"], "bfloat16", [], [], 1, 0),
        TensorEntry("model.empty", ["model", "empty"], "int64", [0, 5], [5, 1], 2, 0),
        TensorEntry("model.emb", ["model", "emb"], "float32", [2, 2], [2, 1], 3, 0),
        TensorEntry("model.head", ["model", "head"], "float32", [2, 2], [1, 2], 3, 0),  # transposed view of emb
        TensorEntry("model.emb#5", ["model.emb"], "float32", [2], [1], 3, 8),            # same dotted name, 2nd path
    ]
    tree = {"model": {"w": TensorRef(0), "scale": TensorRef(1), "empty": TensorRef(2), "emb": TensorRef(3),
                      "head": TensorRef(4)},
            "model.emb": TensorRef(5),
            "optimizer": {"state": {0: {"step": 3}}, "param_groups": [{"betas": (0.9, 0.999), "params": [0]}]},
            "misc": [None, True, -7, 1.5, float("nan"), "text", b"\x00\xff"]}
    m = Manifest(parent="0ff34f00003b87673eee61280a7fc9a8", time=FIXED_TIME, tree=tree, tensors=tensors,
                 blobs=blobs, step=3, metrics={"loss": 0.25}, meta={"run": "vectors"}, writer="deltackpt 0.1.0",
                 extra={"written": {"bytes": 0}})
    data = m.to_bytes()
    return {"manifest": data.hex(), "version_id": hex_id(data),
            "decoded": {"parent": m.parent, "time": m.time, "step": m.step, "metrics": jsonish(m.metrics),
                        "meta": jsonish(m.meta), "writer": m.writer, "extra": jsonish(m.extra),
                        "blobs": [jsonish(x.to_obj()) for x in blobs],
                        "tensors": [jsonish(t.to_obj()) for t in tensors], "tree": jsonish(tree)}}


def config_vector(version: int = config_fmt.FORMAT_VERSION) -> dict:
    cfg = config_fmt.Config(repo_id=FIXED_REPO_ID, created=FIXED_TIME, version=version,
                            delta_base=config_fmt.default_delta_base(version))
    data = cfg.to_bytes()
    decoded = {"format": "deltackpt", "version": cfg.version, "repo_id": cfg.repo_id, "created": cfg.created,
               "chunk_bytes": cfg.chunk_bytes, "keyframe_interval": cfg.keyframe_interval}
    if version >= 2:
        decoded["delta_base"] = cfg.delta_base
    return {"config": data.hex(), "decoded": decoded}


def ref_vector(version_id: str) -> dict:
    return {"ref": refs.encode_ref(version_id).hex(), "version_id": version_id}


def event_vector(version_id: str) -> dict:
    """A rollback record and a drill record (spec/FORMAT.md, "Event records"), each as written."""
    rollback = {"kind": "rollback", "time": FIXED_TIME, "host": "trainer-0", "pid": 4242, "run": "0123456789abcdef",
                "version": version_id, "step": 1203, "seconds": 0.25, "bytes_read": 1048576,
                "metric": "loss", "rule": "spike", "value": 41.5, "threshold": 3.75, "baseline": 2.5,
                "values": [[1201, 2.5], [1202, 2.625], [1203, 41.5]], "bad_start": 1203, "to_step": 1200,
                "abandoned": ["ff" * 16], "committed": "ee" * 16, "data": "skip",
                "skipped": [[3, 9600], [3, 9624]], "lr_scale": 0.5, "count": 1, "commit_seconds": 0.125}
    drill = {"kind": "drill", "time": FIXED_TIME + 60.0, "host": "trainer-0", "pid": 4242, "version": version_id,
             "seconds": 1.5, "bytes_read": 3000000, "revision": "latest", "ok": True, "logical_bytes": 4000000,
             "chunks": 3, "cpu_seconds": 1.25}
    cases = []
    for record in (rollback, drill):
        data = events_fmt.encode(record)
        cases.append({"event": data.hex(), "event_id": hex_id(data), "decoded": jsonish(record)})
    return {"cases": cases}


def build_all() -> dict[str, Any]:
    cases = codec_vectors()
    pack = pack_vector(cases)
    man = manifest_vector()
    out: dict[str, Any] = {f"codec-{name}": {"cases": c} for name, c in cases.items()}
    out.update({"pack": pack, "index": index_vector(pack), "index-v2": index_vector(pack, 2), "manifest": man,
                "config": config_vector(2), "config-v1": config_vector(1), "config-v3": config_vector(3),
                "ref": ref_vector(man["version_id"]), "event": event_vector(man["version_id"])})
    for v in out.values():
        v["generator"] = {"zstd": zstandard.ZSTD_VERSION and ".".join(map(str, zstandard.ZSTD_VERSION))}
    return out


def main() -> None:
    for name, value in build_all().items():
        with open(os.path.join(HERE, f"{name}.json"), "w") as f:
            json.dump(value, f, indent=1, sort_keys=True)
            f.write("\n")
    print(f"wrote {len(build_all())} vector files to {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()
