"""Encodings 5 and 6: block-quantized deltas (int8 / int4 with one float32 scale per block).

The delta is taken against the DECODED base, so quantization error never accumulates along a
chain: every version is within one quantization step of its true value.  The scaled variants
(encodings 10 and 11, scaled_quantize.py) reuse this class with another prediction and step rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from ._delta_util import base_array
from .base import ChunkContext, Codec, Encoded, is_int
from .bytegroup import zstd_compress, zstd_decompress
from .floats import LOSSY_DTYPES, from_float, max_abs_err, to_float

BLOCK = 256
REL_STEP = 2.0 ** -8
"""Coarsest step, relative to a block's rms value, that the encoder may use for signed tensors."""
_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


class QuantizedDelta(Codec):
    needs_base = True
    lossless = False

    def __init__(self, encoding_id: int, bits: int) -> None:
        self.encoding_id = encoding_id
        self.bits = bits
        self.qmax = (1 << (bits - 1)) - 1
        self.name = f"q{bits}-delta"

    # -- the parts the scaled variant changes ---------------------------------------------------
    def _fit(self, new_f: np.ndarray, base_f: np.ndarray) -> dict[str, Any] | None:
        """Extra parameters of the prediction (none here: the prediction is the base itself)."""
        return {}

    def _predict(self, base_f: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        return base_f

    def _floor(self, v: np.ndarray, nonneg: bool, extra: dict[str, Any]) -> np.ndarray | None:
        """Per-block lower bound on the step (``v``: the new values in zero-padded blocks); None for none."""
        if nonneg:
            return None
        # signed tensors (weights, first moments): a step below rms(block)/2**8 buys precision
        # nobody can use (bf16 keeps 8 bits), so small deltas round to zero and cost ~nothing;
        # the error still never accumulates because the delta is against the decoded base
        return (np.sqrt(np.mean(np.square(v.astype(np.float64)), axis=1)) * REL_STEP).astype(np.float32)

    def _final_scales(self, scales: np.ndarray, q: np.ndarray) -> np.ndarray:
        return scales

    # -- shared ---------------------------------------------------------------------------------
    def _codes(self, d: np.ndarray, v: np.ndarray, nonneg: bool,
               extra: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Scales and int8 codes of the residual ``d`` (blocks of BLOCK; ``v``: the new values)."""
        peak = np.abs(d).max(axis=1)
        scales = (peak / self.qmax).astype(np.float32)
        floor = self._floor(v, nonneg, extra)
        if floor is not None:
            scales = np.where(peak > 0, np.maximum(scales, floor), 0).astype(np.float32)
        safe = np.where(scales > 0, scales, 1).astype(d.dtype)
        return scales, np.clip(np.rint(d / safe[:, None]), -self.qmax, self.qmax).astype(np.int8)

    def _reconstruct(self, pred: np.ndarray, q: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
        step = np.repeat(scales, BLOCK)[:n].astype(pred.dtype)
        return pred + q[:n].astype(pred.dtype) * step

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded | None:
        if ctx.dtype not in LOSSY_DTYPES or base is None or len(base) != len(raw) or not raw:
            return None
        new_f, base_f = to_float(raw, ctx.dtype), to_float(base, ctx.dtype)
        if not (np.isfinite(new_f).all() and np.isfinite(base_f).all()):
            return None  # non-finite values are kept exactly by a lossless codec
        extra = self._fit(new_f, base_f)
        if extra is None:
            return None
        pred = self._predict(base_f, extra)
        n = len(new_f)
        nblocks = (n + BLOCK - 1) // BLOCK
        d, v = np.zeros((2, nblocks * BLOCK), dtype=base_f.dtype)
        d[:n], v[:n] = new_f - pred, new_f
        nonneg = bool((new_f >= 0).all())
        scales, q = self._codes(d.reshape(nblocks, BLOCK), v.reshape(nblocks, BLOCK), nonneg, extra)
        q = q.reshape(-1)
        rec_f = self._reconstruct(pred, q, scales, n)
        # a value that was >= 0 (Adam's second moment) must not come back negative, and a positive
        # one not as zero: sqrt(v) + eps would blow the update up.  One step up fixes it.
        bad = ((new_f > 0) & (rec_f <= 0)) | ((new_f == 0) & (rec_f < 0)) if nonneg else None
        if bad is not None and bad.any():
            idx = np.nonzero(bad)[0]
            if (q[idx] >= self.qmax).any():
                return None
            q[idx] += 1
            rec_f = self._reconstruct(pred, q, scales, n)
            if (((new_f > 0) & (rec_f <= 0)) | ((new_f == 0) & (rec_f < 0))).any():
                return None
        scales = self._final_scales(scales, q)  # (leaves rec_f as it is)
        recon = from_float(rec_f, ctx.dtype)
        if not np.isfinite(to_float(recon, ctx.dtype)).all():
            return None  # the prediction or the rounding to dt overflowed: keep the chunk exact
        packed = q if self.bits == 8 else _pack4(q)
        payload = zstd_compress(scales.tobytes() + packed.tobytes(), ctx.level)
        return Encoded({"dt": ctx.dtype, "n": n} | extra, payload, recon, max_abs_err(recon, raw, ctx.dtype))

    def _check_extra(self, params: dict[str, Any]) -> None:
        """Validate the prediction's parameters (none here)."""

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        base_array(base, raw_len, self.name)
        assert base is not None   # base_array refused a missing one
        dtype, n = params.get("dt"), params.get("n")
        if dtype not in LOSSY_DTYPES or not is_int(n) or n < 0:
            raise CorruptObjectError(f"{self.name}: parameters are malformed")
        self._check_extra(params)
        if raw_len % _ITEMSIZE[dtype]:
            raise CorruptObjectError(f"{self.name}: {raw_len} bytes is not a whole number of {dtype} elements")
        base_f = to_float(base, dtype)
        if len(base_f) != n:
            raise CorruptObjectError(f"{self.name}: {n} elements declared, base holds {len(base_f)}")
        nblocks = (n + BLOCK - 1) // BLOCK
        qbytes = nblocks * BLOCK if self.bits == 8 else nblocks * BLOCK // 2
        body = np.frombuffer(zstd_decompress(payload, nblocks * 4 + qbytes, what=self.name), dtype=np.uint8)
        scales = body[:nblocks * 4].view(np.float32)
        q = body[nblocks * 4:].view(np.int8) if self.bits == 8 else _unpack4(body[nblocks * 4:])
        return from_float(self._reconstruct(self._predict(base_f, params), q, scales, n), dtype)


def _pack4(q: np.ndarray) -> np.ndarray:
    u = (q.astype(np.int16) & 0xF).astype(np.uint8)
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8)


def _unpack4(packed: np.ndarray) -> np.ndarray:
    lo = (packed & 0xF).astype(np.int8)
    hi = (packed >> 4).astype(np.int8)
    out = np.empty(len(packed) * 2, dtype=np.int8)
    out[0::2] = np.where(lo > 7, lo - 16, lo)
    out[1::2] = np.where(hi > 7, hi - 16, hi)
    return out
