"""Every codec against arbitrary bytes: lossless ones round-trip bit-exactly, lossy ones stay within
the error they record and decode to exactly the bytes they promised, and hostile parameters or
payloads only ever raise CorruptObjectError."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltackpt.codecs.base import ChunkContext
from deltackpt.codecs.floats import to_float
from deltackpt.codecs.pipeline import BaseChunk, encode_chunk
from deltackpt.codecs.registry import RAW, SPARSE, all_codecs, get
from deltackpt.errors import CorruptObjectError

LOSSLESS = [c for c in all_codecs() if c.lossless]
LOSSY = [c for c in all_codecs() if not c.lossless]
DTYPE_OF = {1: "uint8", 2: "bfloat16", 4: "float32", 8: "float64", 16: "complex128"}
FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]

# bit patterns float codecs must survive: NaN with payloads, -0.0, subnormals, infinities
SPECIAL32 = [0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000]


@st.composite
def chunk_pairs(draw, itemsize=None):
    """(raw, base-or-None, itemsize, row_bytes) where base, when present, is a perturbed copy of raw."""
    w = draw(st.sampled_from([1, 2, 4, 8, 16])) if itemsize is None else itemsize
    n = draw(st.integers(0, 200))
    kind = draw(st.sampled_from(["bytes", "floats", "special"]))
    if kind == "bytes":
        raw = bytearray(draw(st.binary(min_size=n * w, max_size=n * w)))
    elif kind == "floats":
        vals = np.asarray(draw(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True),
                                        min_size=n * w // 4 + 1, max_size=n * w // 4 + 1)), dtype=np.float32)
        raw = bytearray(vals.tobytes()[: n * w].ljust(n * w, b"\0"))
    else:
        words = draw(st.lists(st.sampled_from(SPECIAL32), min_size=n * w // 4 + 1, max_size=n * w // 4 + 1))
        raw = bytearray(struct.pack(f"<{len(words)}I", *words)[: n * w].ljust(n * w, b"\0"))
    base = None
    if draw(st.booleans()):
        base = bytearray(raw)
        for _ in range(draw(st.integers(0, 20))):
            if base:
                base[draw(st.integers(0, len(base) - 1))] = draw(st.integers(0, 255))
        if draw(st.booleans()):
            base = bytearray(draw(st.binary(min_size=len(raw), max_size=len(raw))))
    row = draw(st.sampled_from([0, w, 4 * w, 64 * w]))
    return bytes(raw), None if base is None else bytes(base), w, row


@given(chunk_pairs())
def test_lossless_codecs_round_trip_bit_exactly(case):
    """Each lossless codec reproduces arbitrary bytes (NaN payloads, -0.0, subnormals) bit for bit."""
    raw, base, w, row = case
    ctx = ChunkContext(DTYPE_OF[w], w, row)
    for codec in LOSSLESS:
        if codec.needs_base and base is None:
            continue
        enc = codec.encode(raw, ctx, base)
        if enc is None:
            continue
        assert enc.recon is None
        assert bytes(codec.decode(enc.params, enc.payload, len(raw), base)) == raw, codec.name
        if codec.needs_base:  # the reader's in-place path: the delta decoded over its base
            buf = bytearray(base)
            codec.apply_into(memoryview(buf), enc.params, enc.payload)
            assert bytes(buf) == raw, codec.name


@st.composite
def float_pairs(draw):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    size = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[dtype]
    n = draw(st.integers(1, 300))
    finite = draw(st.booleans())
    floats = st.floats(-1e4, 1e4, width=32) if finite else st.floats(width=32)
    base = np.asarray(draw(st.lists(floats, min_size=n, max_size=n)), dtype=np.float32)
    step = draw(st.sampled_from([0.0, 1e-6, 1e-3, 1.0]))
    new = base + np.asarray(draw(st.lists(st.floats(-1, 1, width=32), min_size=n, max_size=n)),
                            dtype=np.float32) * np.float32(step)
    if draw(st.booleans()):
        k = draw(st.integers(0, n))
        new[:k] = base[:k]  # unchanged elements, as in a sparse update

    def enc(v):
        if dtype == "float32":
            return v.astype(np.float32).tobytes()
        if dtype == "float64":
            return v.astype(np.float64).tobytes()
        if dtype == "float16":
            with np.errstate(over="ignore"):
                return v.astype(np.float16).tobytes()
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return dtype, size, enc(new), enc(base)


@given(float_pairs())
def test_lossy_codecs_stay_within_recorded_error(case):
    """A lossy codec decodes to exactly its promised ``recon`` and no element is off by more than max_abs_err."""
    dtype, size, raw, base = case
    ctx = ChunkContext(dtype, size, size)
    for codec in LOSSY:
        enc = codec.encode(raw, ctx, base if codec.needs_base else None)
        if enc is None:
            continue
        out = bytes(codec.decode(enc.params, enc.payload, len(raw), base if codec.needs_base else None))
        assert out == enc.recon, codec.name
        a = to_float(out, dtype).astype(np.float64)
        b = to_float(raw, dtype).astype(np.float64)
        assert np.array_equal(np.isnan(a), np.isnan(b)), codec.name
        fin = np.isfinite(b)
        assert np.array_equal(a[~fin & ~np.isnan(b)], b[~fin & ~np.isnan(b)]), codec.name
        assert np.isfinite(enc.max_abs_err) and enc.max_abs_err >= 0, codec.name
        if fin.any():
            assert np.max(np.abs(a[fin] - b[fin])) <= enc.max_abs_err, codec.name


def test_q8_delta_error_is_bounded_by_the_block_step():
    """q8 against the decoded base stays within half a block step (max(peak/127, rms/256)) of the
    truth after 10 versions: the error does not accumulate along the chain."""
    from deltackpt.codecs.quantize import BLOCK, REL_STEP
    from deltackpt.codecs.registry import Q8_DELTA, get
    rng = np.random.default_rng(0)
    truth = rng.standard_normal(4096).astype(np.float32)
    ctx = ChunkContext("float32", 4, 4)
    decoded = truth.tobytes()
    for _ in range(10):
        prev = np.frombuffer(decoded, np.float32)
        truth = truth + rng.standard_normal(4096).astype(np.float32) * 1e-2
        enc = get(Q8_DELTA).encode(truth.tobytes(), ctx, decoded)
        decoded = get(Q8_DELTA).decode(enc.params, enc.payload, len(decoded), decoded)
        err = np.abs(np.frombuffer(decoded, np.float32) - truth).reshape(-1, BLOCK).max(axis=1)
        peak = np.abs(truth - prev).reshape(-1, BLOCK).max(axis=1)
        rms = np.sqrt(np.mean(np.square(truth.astype(np.float64)).reshape(-1, BLOCK), axis=1))
        assert (err <= np.maximum(peak / 127, rms * REL_STEP) * 0.5 * (1 + 1e-5)).all()
        assert err.max() == pytest.approx(enc.max_abs_err)


@pytest.mark.parametrize("eid", [5, 6, 10, 11])
def test_quantized_deltas_keep_second_moments_positive(eid):
    """Tiny positive values next to large ones in a block (Adam's exp_avg_sq) never decode to <= 0."""
    from deltackpt.codecs.registry import get
    rng = np.random.default_rng(4)
    base = (rng.standard_normal(8192) ** 2 * 10.0 ** rng.uniform(-12, 0, 8192)).astype(np.float32)
    new = (base * 0.98 + (rng.standard_normal(8192) ** 2) * 1e-3 * 10.0 ** rng.uniform(-12, 0, 8192)).astype(np.float32)
    ctx = ChunkContext("float32", 4, 4)
    enc = get(eid).encode(new.tobytes(), ctx, base.tobytes())
    assert enc is not None
    out = np.frombuffer(get(eid).decode(enc.params, enc.payload, new.nbytes, base.tobytes()), np.float32)
    assert (out > 0).all()


params_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=3), inner, max_size=5),
    max_leaves=30)


@st.composite
def hostile(draw):
    codec = draw(st.sampled_from(all_codecs()))
    raw, base, w, row = draw(chunk_pairs())
    ctx = ChunkContext(DTYPE_OF[w] if codec.lossless else "float32", w if codec.lossless else 4, row)
    if not codec.lossless:
        raw = raw[: len(raw) // 4 * 4]
        base = None if base is None else base[: len(raw)]
    enc = codec.encode(raw, ctx, base if codec.needs_base else None) if (base is not None or not codec.needs_base) else None
    params = dict(enc.params) if enc is not None else {}
    payload = enc.payload if enc is not None else b""
    how = draw(st.sampled_from(["params", "payload", "both", "raw_len", "base"]))
    if how in ("params", "both"):
        keys = list(params) + ["w", "m", "s", "dt", "n", "rb", "bm", "x"]
        for _ in range(draw(st.integers(1, 4))):
            params[draw(st.sampled_from(keys))] = draw(params_values)
    if how in ("payload", "both"):
        b = bytearray(payload)
        op = draw(st.sampled_from(["flip", "cut", "extend", "random"]))
        if op == "flip" and b:
            b[draw(st.integers(0, len(b) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            b = b[: draw(st.integers(0, len(b)))]
        elif op == "extend":
            b += draw(st.binary(min_size=1, max_size=64))
        else:
            b = bytearray(draw(st.binary(max_size=256)))
        payload = bytes(b)
    raw_len = len(raw)
    if how == "raw_len":
        raw_len = draw(st.integers(0, 1 << 20))
    if how == "base":
        base = draw(st.none() | st.binary(max_size=64))
        if base is not None and draw(st.booleans()):
            raw_len = len(base)  # a base that matches raw_len but not the element size
    return codec, params, payload, raw_len, base


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(hostile())
def test_malformed_objects_raise_only_corrupt_object_error(case):
    """Decoders fed mangled params, payloads, lengths or bases raise CorruptObjectError or return raw_len bytes."""
    codec, params, payload, raw_len, base = case
    if codec.needs_base and base is not None and len(base) == raw_len:
        try:
            codec.apply_into(memoryview(bytearray(base)), params, payload)
        except CorruptObjectError:
            pass
    try:
        out = codec.decode(params, payload, raw_len, base)
    except CorruptObjectError:
        return
    assert len(out) == raw_len


@pytest.mark.parametrize("eid,params,raw_len", [
    (5, {"dt": "float16", "n": 1}, 3), (5, {"dt": "float32", "n": 0}, 3), (6, {"dt": "bfloat16", "n": 2}, 5),
    (7, {"dt": "float64", "w": 2, "m": [0, 0], "s": [1, 1]}, 12), (3, {"w": 3, "m": [0, 0, 0], "s": [1, 1, 1]}, 3),
    (4, {"rb": True, "n": 0, "bm": 0}, 1), (2, {"w": True, "m": [0], "s": [0]}, 0), (3, {"w": True, "m": [0], "s": [0]}, 0), (5, {"dt": ["float32"], "n": 1}, 4), (2, {"w": 16, "m": [0] * 16, "s": [0] * 16}, 16),
])
def test_decoders_check_element_sizes_before_viewing(eid, params, raw_len):
    """Lengths that are not whole elements of the declared dtype are corrupt, not a numpy ValueError."""
    from deltackpt.codecs.registry import get
    with pytest.raises(CorruptObjectError):
        get(eid).decode(params, b"", raw_len, bytes(raw_len))


def test_pipeline_stores_incompressible_chunks_raw():
    """Random bytes with an unrelated base: no candidate pays, so the pipeline picks raw."""
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, 1 << 18, dtype=np.uint8).tobytes()
    base = rng.integers(0, 256, 1 << 18, dtype=np.uint8).tobytes()
    ctx = ChunkContext("float32", 4, 4 * 64)
    choice = encode_chunk(raw, ctx, base=BaseChunk(b"\0" * 16, base, 0))
    assert choice.encoding == RAW and choice.base is None and choice.encoded.payload == raw


def test_pipeline_uses_a_delta_when_it_pays():
    """A slightly perturbed float chunk with its base is stored as a delta, smaller than a keyframe."""
    rng = np.random.default_rng(2)
    base = rng.standard_normal(1 << 16).astype(np.float32)
    new = base + rng.standard_normal(1 << 16).astype(np.float32) * 1e-5
    ctx = ChunkContext("float32", 4, 4 * 256)
    key = encode_chunk(new.tobytes(), ctx)
    delta = encode_chunk(new.tobytes(), ctx, base=BaseChunk(b"\1" * 16, base.tobytes(), 0))
    assert delta.base is not None and delta.depth == 1
    assert len(delta.encoded.payload) < 0.8 * len(key.encoded.payload)


def test_pipeline_tries_only_the_preferred_delta_codec_and_falls_back_when_it_cannot_apply():
    """``prefer`` (the last winner at this position) skips sampling: the preferred codec is used
    even where sampling would pick another; one that does not apply (no shared decay ratio for
    scaled-delta) falls back to sampling, and without a base it is ignored."""
    from deltackpt.codecs.registry import BG_ZSTD, SCALED_DELTA, XOR_DELTA
    rng = np.random.default_rng(4)
    base = rng.standard_normal(1 << 16).astype(np.float32)
    new = base + rng.standard_normal(1 << 16).astype(np.float32) * 1e-3
    ctx = ChunkContext("float32", 4, 4 * 256)
    base_chunk = BaseChunk(b"\1" * 16, base.tobytes(), 0)
    sampled = encode_chunk(new.tobytes(), ctx, base=base_chunk)
    assert sampled.encoding != XOR_DELTA          # the premise: sampling picks another codec
    forced = encode_chunk(new.tobytes(), ctx, base=base_chunk, prefer=XOR_DELTA)
    assert forced.encoding == XOR_DELTA and forced.base is base_chunk
    fallback = encode_chunk(new.tobytes(), ctx, base=base_chunk, prefer=SCALED_DELTA)
    assert fallback.encoding == sampled.encoding
    assert encode_chunk(new.tobytes(), ctx, prefer=XOR_DELTA).encoding == BG_ZSTD


def test_a_preferred_dense_delta_codec_is_not_second_guessed_by_sparse_rows():
    """Where a dense delta won last time, sparse rows are not tried (ruling them out costs a full
    pass where up to half the rows changed), even on a chunk where they would be smaller; where
    sparse won last time, or the preferred codec does not apply, sparse is tried as before."""
    from deltackpt.codecs.registry import SCALED_DELTA, SPARSE, SUB_DELTA
    rng = np.random.default_rng(5)
    base = rng.standard_normal((512, 256)).astype(np.float32)
    new = base.copy()
    new[::10] = rng.standard_normal((len(new[::10]), 256)).astype(np.float32)  # a tenth of the rows rewritten
    ctx = ChunkContext("float32", 4, 4 * 256)
    base_chunk = BaseChunk(b"\1" * 16, base.tobytes(), 0)
    assert encode_chunk(new.tobytes(), ctx, base=base_chunk).encoding == SPARSE   # the premise
    assert encode_chunk(new.tobytes(), ctx, base=base_chunk, prefer=SPARSE).encoding == SPARSE
    forced = encode_chunk(new.tobytes(), ctx, base=base_chunk, prefer=SUB_DELTA)
    assert forced.encoding == SUB_DELTA and forced.base is base_chunk
    assert encode_chunk(new.tobytes(), ctx, base=base_chunk, prefer=SCALED_DELTA).encoding == SPARSE  # no shared decay


def test_a_preferred_delta_that_outgrew_its_keyframe_competes_with_a_fresh_keyframe():
    """A delta no smaller than the keyframe it is taken against (a star delta far from its keyframe)
    is not kept blindly: the other codecs are sampled again, and a fresh keyframe wins where it is
    smaller.  With the keyframe's size unknown, or a delta below it, the preferred codec stands."""
    from deltackpt.codecs.registry import BG_ZSTD, SUB_DELTA
    rng = np.random.default_rng(8)
    base = rng.standard_normal(1 << 16).astype(np.float32)          # noise: its keyframe hardly shrinks
    new = np.repeat(rng.standard_normal(1 << 8), 1 << 8).astype(np.float32)  # runs: zstd alone does well
    ctx = ChunkContext("float32", 4, 4)
    raw, data = new.tobytes(), base.tobytes()
    kept = encode_chunk(raw, ctx, base=BaseChunk(b"\1" * 16, data, 0), prefer=SUB_DELTA)
    assert kept.encoding == SUB_DELTA                                # the keyframe's size unknown
    small = encode_chunk(raw, ctx, base=BaseChunk(b"\1" * 16, data, 0, stored_bytes=len(data)), prefer=SUB_DELTA)
    assert small.encoding == SUB_DELTA                               # the delta is below the keyframe
    fresh = encode_chunk(raw, ctx, base=BaseChunk(b"\1" * 16, data, 0, stored_bytes=1000), prefer=SUB_DELTA)
    assert fresh.encoding == BG_ZSTD and fresh.base is None and len(fresh.encoded.payload) < len(kept.encoded.payload)
    deep = encode_chunk(raw, ctx, base=BaseChunk(b"\1" * 16, data, 1, stored_bytes=1000), prefer=SUB_DELTA)
    assert deep.encoding == SUB_DELTA        # a base that is itself a delta: its size says nothing of a keyframe


def test_pipeline_respects_the_keyframe_interval():
    """A base already K deep is ignored: the chunk becomes a keyframe, so chains stay <= K."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal(1 << 14).astype(np.float32)
    new = base + np.float32(1e-6)
    ctx = ChunkContext("float32", 4, 4)
    choice = encode_chunk(new.tobytes(), ctx, base=BaseChunk(b"\1" * 16, base.tobytes(), 4), keyframe_interval=4)
    assert choice.base is None and choice.depth == 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scaled_delta_round_trips_decaying_moments_with_special_values(dtype):
    """Adam-like decay (new = 0.9**20 * base for untouched rows) plus NaN/inf/-0.0/subnormals round-trips
    bit-exactly through scaled-delta, and the pipeline prefers it to the plain integer delta."""
    from deltackpt.codecs.registry import SCALED_DELTA, get
    rng = np.random.default_rng(5)
    ftype = np.dtype(dtype).type
    base = (rng.standard_normal(1 << 15) * 1e-3).astype(ftype)
    new = base.copy()
    for _ in range(20):
        new = (new * ftype(0.9)).astype(ftype)
    touched = rng.random(len(base)) < 0.3
    new[touched] = (rng.standard_normal(int(touched.sum())) * 1e-3).astype(ftype)
    new[:4] = np.array([np.nan, -0.0, np.inf, np.finfo(ftype).smallest_subnormal], dtype=ftype)
    base[4:6] = np.array([np.nan, -np.inf], dtype=ftype)
    ctx = ChunkContext(dtype, base.itemsize, base.itemsize * 64)
    enc = get(SCALED_DELTA).encode(new.tobytes(), ctx, base.tobytes())
    assert enc is not None
    assert bytes(get(SCALED_DELTA).decode(enc.params, enc.payload, new.nbytes, base.tobytes())) == new.tobytes()
    choice = encode_chunk(new.tobytes(), ctx, base=BaseChunk(b"\1" * 16, base.tobytes(), 0))
    assert choice.encoding == SCALED_DELTA


@pytest.mark.parametrize("kind", ["weights", "repeats"])
def test_keyframe_planes_past_the_sample_round_trip_and_pick_the_smaller_compressor(kind):
    """A keyframe whose planes are long enough for the literal-tuned zstd parameters round-trips,
    and the plane compressor chosen on the sample is never worse there than the level alone."""
    from deltackpt.codecs import bytegroup
    from deltackpt.codecs.registry import BG_ZSTD, get

    rng = np.random.default_rng(3)
    if kind == "weights":   # an exponent plane of ~3 bits a byte: the tuned parameters win
        vals = (rng.standard_normal(256 * 1024) * 0.05).astype(np.float32)
    else:                   # a short pattern repeated: matches are real, the level may win
        vals = np.tile((rng.standard_normal(97) * 1e-3).astype(np.float32), 256 * 1024 // 97 + 1)[:256 * 1024]
    raw = vals.tobytes()
    codec = get(BG_ZSTD)
    enc = codec.encode(raw, ChunkContext("float32", 4, 4 * 1024, 1))
    assert bytes(codec.decode(enc.params, bytes(enc.payload), len(raw))) == raw
    planes = bytegroup.group(raw, 4)
    sample = memoryview(planes[3])[:bytegroup._SAMPLE]
    cctx, size, _which = bytegroup._choose(sample, 1)
    assert size <= len(bytegroup.zstd_compress(sample, 1))
    assert enc.params["m"][3] == 1 and enc.params["s"][3] <= len(bytegroup.zstd_compress(memoryview(planes[3]), 1)) * 1.02


INVERTIBLE = [c for c in all_codecs() if c.invertible]


def test_the_invertible_codecs_are_xor_sub_delta_and_sparse():
    """Live rollback on forward-chained repositories undoes exactly these deltas (sparse XORs the
    same rows back, so it is its own inverse too)."""
    assert sorted(c.name for c in INVERTIBLE) == ["sparse", "sub-delta", "xor-delta"]


@given(chunk_pairs())
def test_invertible_deltas_undo_in_place_to_their_base(case):
    """unapply_into turns the chunk a delta decodes to back into the delta's base, bit for bit."""
    raw, base, w, row = case
    if base is None:
        return
    ctx = ChunkContext(DTYPE_OF[w], w, row)
    for codec in INVERTIBLE:
        enc = codec.encode(raw, ctx, base)
        if enc is None:
            continue
        out = bytearray(raw)
        codec.unapply_into(memoryview(out), enc.params, enc.payload)
        assert bytes(out) == base, codec.name


@pytest.mark.parametrize("rb", [1, 2, 3, 4, 8, 12, 36, 256])
def test_sparse_rows_finds_exactly_the_rows_with_a_changed_byte(rb):
    """The changed rows a sparse delta takes (found as words, codecs/sparse.py) are exactly the
    rows with any non-zero byte of the XOR, whatever the row length and wherever in the row the
    byte is (first, last, the middle of a word), and the delta of such a chunk decodes bit-identical."""
    from deltackpt.codecs.sparse import _nonzero_rows
    rng = np.random.default_rng(rb)
    rows = (1 << 16) // rb
    x = np.zeros((rows, rb), dtype=np.uint8)
    picked = rng.choice(rows, 40, replace=False)
    for k, r in enumerate(picked):
        x[r, (0, rb - 1, rb // 2)[k % 3]] = rng.integers(1, 256)
    assert (_nonzero_rows(x) == x.any(axis=1)).all() and _nonzero_rows(x).sum() == 40
    base = rng.integers(0, 256, rows * rb, dtype=np.uint8)
    new = base ^ x.reshape(-1)
    ctx = ChunkContext("uint8", 1, rb)
    enc = get(SPARSE).encode(new.tobytes(), ctx, base.tobytes())
    assert enc is not None and enc.params["n"] == 40
    assert bytes(get(SPARSE).decode(enc.params, enc.payload, len(new), base.tobytes())) == new.tobytes()
