"""q8/q4-scaled-delta (encodings 10, 11): the spec page is enough to decode them, the error stays
within half a step of the version being decoded (so it never accumulates along a chain), second
moments stay positive, unknown ids are refused, and the q8-delta/q4-delta modes pick them where
they are smaller."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from deltackpt.codecs.base import ChunkContext
from deltackpt.codecs.pipeline import BaseChunk, encode_chunk
from deltackpt.codecs.quantize import REL_STEP
from deltackpt.codecs.registry import Q4_DELTA, Q4_SCALED_DELTA, Q8_DELTA, Q8_SCALED_DELTA, get
from deltackpt.codecs.scaled_quantize import PEAK_FLOOR, _decaying
from deltackpt.errors import CorruptObjectError
from deltackpt.format import objects

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "spec", "vectors")
CTX = ChunkContext("float32", 4, 4)


def spec_decode(enc: int, params: dict, payload: bytes, raw_len: int, base: bytes) -> bytes:
    """spec/codecs/q8-scaled-delta.md and q4-scaled-delta.md, "Decode", for float32/float16/bfloat16
    (F = float32), written from the pages and nothing else of deltackpt."""
    dt, n, a = params["dt"], params["n"], params["a"]
    nblocks = -(-n // 256)
    qbytes = nblocks * 256 if enc == 10 else nblocks * 128
    assert zstandard.frame_content_size(payload) == nblocks * 4 + qbytes
    body = zstandard.ZstdDecompressor().decompress(payload, max_output_size=nblocks * 4 + qbytes)
    scales = np.frombuffer(body[:nblocks * 4], "<f4")
    if enc == 10:
        q = np.frombuffer(body[nblocks * 4:], np.int8)
    else:
        nib = np.frombuffer(body[nblocks * 4:], np.uint8)
        v = np.empty(2 * len(nib), np.int16)
        v[0::2], v[1::2] = nib & 0xF, nib >> 4
        q = np.where(v > 7, v - 16, v)
    if dt == "float32":
        b = np.frombuffer(base, "<f4")
    elif dt == "float16":
        b = np.frombuffer(base, "<f2").astype(np.float32)
    else:
        b = (np.frombuffer(base, "<u2").astype(np.uint32) << 16).view(np.float32)
    assert len(b) == n
    p = (b.astype(np.float64) * a).astype(np.float32)
    r = p + q[:n].astype(np.float32) * np.repeat(scales, 256)[:n]
    if dt == "float32":
        return r.astype("<f4").tobytes()
    if dt == "float16":
        return r.astype("<f2").tobytes()
    u = r.view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype("<u2").tobytes()  # no NaN: finite inputs only


@pytest.mark.parametrize("name", ["q8-scaled-delta", "q4-scaled-delta"])
def test_spec_pages_decode_the_golden_vectors(name):
    """A decoder written from the spec pages alone reproduces every vector's decoded bytes."""
    with open(os.path.join(VECTORS, f"codec-{name}.json")) as f:
        cases = json.load(f)["cases"]
    for c in cases:
        obj = objects.parse(bytes.fromhex(c["object"]))
        out = spec_decode(obj.encoding, obj.params, bytes(obj.payload), obj.raw_len, bytes.fromhex(c["base"]))
        assert out.hex() == c["decoded"], c["note"]


def _steps(eid: int, enc, new: np.ndarray) -> np.ndarray:
    """Per element, the step its block was coded with: the stored scale, or for a block stored with
    scale 0 (all codes zero) the writer's floor, which depends on this version's values only."""
    n = len(new)
    nblocks = -(-n // 256)
    body = zstandard.ZstdDecompressor().decompress(enc.payload)
    scales = np.frombuffer(body[:nblocks * 4], np.float32).astype(np.float64)
    v = np.zeros(nblocks * 256)
    v[:n] = new
    v = v.reshape(nblocks, 256)
    floor = np.sqrt(np.mean(v * v, axis=1)) * REL_STEP
    if _decaying(enc.params["a"], bool((new >= 0).all())):
        floor = np.maximum(floor, PEAK_FLOOR * np.abs(v).max(axis=1) / get(eid).qmax)
    return np.repeat(np.where(scales > 0, scales, floor.astype(np.float32)), 256)[:n]


@st.composite
def decaying_pairs(draw):
    """(new, base) float32 where most elements decayed by one factor and the rest moved freely."""
    n = draw(st.integers(256, 1200))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal(n) * 10.0 ** draw(st.integers(-6, 1))).astype(np.float32)
    alpha = draw(st.sampled_from([0.12157665, 0.9, 0.98019, 1.0, 1.3]))
    new = (base.astype(np.float64) * alpha).astype(np.float32)
    touched = rng.random(n) < draw(st.sampled_from([0.0, 0.05, 0.3, 0.9]))
    new[touched] = (rng.standard_normal(int(touched.sum())) * np.abs(base).max()).astype(np.float32)
    return new, base


@given(decaying_pairs(), st.sampled_from([Q8_SCALED_DELTA, Q4_SCALED_DELTA]))
def test_error_is_at_most_half_a_step_of_this_version(case, eid):
    """Every element decodes within half its block's step (as written in this object) of the truth,
    the recorded max_abs_err covers it, and the decoder gives exactly the promised bytes."""
    new, base = case
    codec = get(eid)
    enc = codec.encode(new.tobytes(), CTX, base.tobytes())
    assert enc is not None
    out = bytes(codec.decode(enc.params, enc.payload, new.nbytes, base.tobytes()))
    assert out == enc.recon
    err = np.abs(np.frombuffer(out, np.float32).astype(np.float64) - new)
    step = _steps(eid, enc, new.astype(np.float64))
    assert (err <= step / 2 * (1 + 1e-5) + np.abs(new) * 2e-7).all()
    assert err.max() <= enc.max_abs_err


@pytest.mark.parametrize("eid", [Q8_SCALED_DELTA, Q4_SCALED_DELTA])
def test_chain_of_decaying_moments_never_accumulates_error(eid):
    """Ten versions of an Adam-like first moment (70% of rows untouched, so decayed by 0.9**20),
    each a delta against the previous DECODED version: every version is within half of its own
    steps of the truth, and the error of the last version is no larger than the first's bound."""
    rng = np.random.default_rng(3)
    rows, width = 256, 64
    truth = rng.standard_normal((rows, width)).astype(np.float32) * 1e-3
    decoded = truth.tobytes()
    codec, bounds = get(eid), []
    for _ in range(10):
        touched = rng.random(rows) < 0.3
        truth = (truth.astype(np.float64) * 0.9 ** 20).astype(np.float32)
        truth[touched] += rng.standard_normal((int(touched.sum()), width)).astype(np.float32) * 1e-3
        enc = codec.encode(truth.tobytes(), CTX, decoded)
        assert enc is not None and 0.1 < enc.params["a"] < 0.15
        decoded = bytes(codec.decode(enc.params, enc.payload, len(decoded), decoded))
        err = np.abs(np.frombuffer(decoded, np.float32).astype(np.float64) - truth.reshape(-1))
        step = _steps(eid, enc, truth.reshape(-1).astype(np.float64))
        assert (err <= step / 2 * (1 + 1e-5)).all()
        bounds.append(float(step.max()) / 2)
        assert err.max() == pytest.approx(enc.max_abs_err)
    assert enc.max_abs_err <= max(bounds[0], bounds[-1])


@pytest.mark.parametrize("eid", [Q8_SCALED_DELTA, Q4_SCALED_DELTA])
def test_decaying_second_moments_stay_positive_along_a_chain(eid):
    """exp_avg_sq-like chunks (decay 0.98, a few rows grow, magnitudes over 12 decades) never decode
    to a value <= 0, version after version."""
    rng = np.random.default_rng(5)
    truth = (rng.standard_normal(8192) ** 2 * 10.0 ** rng.uniform(-12, 0, 8192)).astype(np.float32)
    decoded = truth.tobytes()
    for _ in range(6):
        grow = rng.random(8192) < 0.3
        truth = (truth.astype(np.float64) * 0.98).astype(np.float32)
        k = int(grow.sum())
        truth[grow] += (rng.standard_normal(k) ** 2 * 10.0 ** rng.uniform(-12, -2, k)).astype(np.float32)
        enc = get(eid).encode(truth.tobytes(), CTX, decoded)
        assert enc is not None
        decoded = bytes(get(eid).decode(enc.params, enc.payload, len(decoded), decoded))
        assert (np.frombuffer(decoded, np.float32) > 0).all()


@pytest.mark.parametrize("eid", [12, 200, 255])
def test_unassigned_encoding_ids_are_refused(eid):
    """Ids after 11 are unassigned: a reader refuses them with a typed error, never guesses."""
    with pytest.raises(CorruptObjectError, match=f"unknown encoding id {eid}"):
        get(eid)


@pytest.mark.parametrize("mode,plain,scaled", [("q8-delta", Q8_DELTA, Q8_SCALED_DELTA),
                                               ("q4-delta", Q4_DELTA, Q4_SCALED_DELTA)])
def test_modes_keep_the_smaller_of_plain_and_scaled(mode, plain, scaled):
    """A decaying chunk is stored scaled and much smaller than the plain delta would be; whatever is
    picked is never larger than either candidate."""
    rng = np.random.default_rng(9)
    base = rng.standard_normal((256, 256)).astype(np.float32) * 1e-3  # an embedding's moment, rows of 256
    new = (base.astype(np.float64) * 0.9 ** 20).astype(np.float32)
    hit = rng.random(256) < 0.3  # rows that saw a token
    new[hit] = rng.standard_normal((int(hit.sum()), 256)).astype(np.float32) * 1e-3
    base, new = base.reshape(-1), new.reshape(-1)
    for b, v in ((base, new), (base, base + np.float32(1e-6))):
        ch = encode_chunk(v.tobytes(), CTX, mode=mode, base=BaseChunk(b"\0" * 16, b.tobytes(), 0))
        sizes = [len(get(e).encode(v.tobytes(), CTX, b.tobytes()).payload) for e in (plain, scaled)]
        assert len(ch.encoded.payload) == min(sizes)
    ch = encode_chunk(new.tobytes(), CTX, mode=mode, base=BaseChunk(b"\0" * 16, base.tobytes(), 0))
    assert ch.encoding == scaled
    assert len(ch.encoded.payload) < 0.5 * len(get(plain).encode(new.tobytes(), CTX, base.tobytes()).payload)
