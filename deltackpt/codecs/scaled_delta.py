"""Encoding 9: integer (zigzag) difference against a SCALED base, ``new - round(alpha * base)``.

Adam's moments decay geometrically wherever a gradient is zero: between two checkpoints an
untouched embedding row has ``exp_avg`` multiplied by beta1**k (0.9**20 = 0.12) and ``exp_avg_sq``
by beta2**k.  A plain delta sees those elements change completely; against ``alpha * base`` they
are a few ulps off.  ``alpha`` is the most common ratio new/base in the chunk (measured on a
sample, then refined to the median of the ratios in that bucket) and is stored in the params, so
the decoder recomputes the same prediction bit for bit (IEEE multiply in float64, one rounding).
The residual is exact integer arithmetic on the bit patterns, so NaN/inf/-0.0 round-trip too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from ._delta_util import base_array
from .base import ChunkContext, Codec, Encoded
from .buffers import buffer, typed
from .bytegroup import compress_planes, decode_planes
from .sub_delta import _BLOCK, unzigzag_add, zigzag_delta_planes

_FLOATS = {"float32": (np.float32, np.uint32), "float64": (np.float64, np.uint64)}
_FIT_SAMPLE = 1 << 12  # enough to find a ratio shared by a tenth of the elements; the sort dominated


def fit_alpha(new: np.ndarray, base: np.ndarray) -> float | None:
    """The dominant ratio new/base (a bucket holding at least a tenth of the sample), else None."""
    step = max(1, len(new) // _FIT_SAMPLE)
    with np.errstate(invalid="ignore", over="ignore"):
        n, b = new[::step].astype(np.float64), base[::step].astype(np.float64)
    ok = np.isfinite(n) & np.isfinite(b) & (b != 0) & (n != 0)
    if ok.sum() < 64:
        return None
    with np.errstate(all="ignore"):
        r = n[ok] / b[ok]
        buckets = np.round(r, 4)   # a huge ratio overflows to inf here; the bound below rejects it
    vals, counts = np.unique(buckets, return_counts=True)
    top = counts.argmax()
    if counts[top] < 0.1 * len(r) or vals[top] == 1.0 or vals[top] == 0.0:
        return None  # no shared decay (or none at all: plain sub-delta is as good)
    alpha = float(np.median(r[buckets == vals[top]]))
    return alpha if math.isfinite(alpha) and 0 < abs(alpha) < 1e6 else None


def _predict(base: np.ndarray, alpha: float, ftype: type) -> np.ndarray:
    with np.errstate(all="ignore"):
        return (base.astype(np.float64) * alpha).astype(ftype)


class ScaledDelta(Codec):
    encoding_id = 9
    name = "scaled-delta"
    needs_base = True

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded | None:
        if ctx.dtype not in _FLOATS or base is None or len(base) != len(raw) or not raw:
            return None
        ftype, utype = _FLOATS[ctx.dtype]
        if len(raw) % np.dtype(ftype).itemsize:
            return None
        new, old = np.frombuffer(raw, dtype=ftype), np.frombuffer(base, dtype=ftype)
        alpha = fit_alpha(new, old)
        if alpha is None:
            return None
        out = zigzag_delta_planes(new.view(utype), old.view(utype),
                                  lambda block: _predict(block.view(ftype), alpha, ftype).view(utype))
        params, payload = compress_planes(out, np.dtype(utype).itemsize, ctx.level)
        params.update({"dt": ctx.dtype, "a": alpha})
        return Encoded(params, payload)

    def _check(self, params: dict[str, Any], raw_len: int) -> tuple[type, type, float]:
        dtype, alpha = params.get("dt"), params.get("a")
        if not isinstance(dtype, str) or dtype not in _FLOATS or not isinstance(alpha, float) or not math.isfinite(alpha):
            raise CorruptObjectError(f"{self.name}: parameters are malformed")
        ftype, utype = _FLOATS[dtype]
        size = np.dtype(ftype).itemsize
        if raw_len % size or params.get("w") != size:
            raise CorruptObjectError(f"{self.name}: {raw_len} bytes is not a whole number of {dtype} elements")
        return ftype, utype, alpha

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview, base: bytes | memoryview | None = None) -> None:
        dest = np.frombuffer(out, dtype=np.uint8)
        b = base_array(base, len(dest), self.name)
        ftype, utype, alpha = self._check(params, len(dest))
        decode_planes(params, payload, len(dest), what=self.name, out=dest)
        self._add_prediction(dest.view(utype), b.view(ftype), alpha, ftype, utype, dest.view(utype))

    def apply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        dest = np.frombuffer(out, dtype=np.uint8)
        ftype, utype, alpha = self._check(params, len(dest))
        z = decode_planes(params, payload, len(dest), what=self.name, out=buffer("delta", len(dest)))
        self._add_prediction(z.view(utype), dest.view(ftype), alpha, ftype, utype, dest.view(utype))

    @staticmethod
    def _add_prediction(z: np.ndarray, bf: np.ndarray, alpha: float, ftype: type, utype: type, dst: np.ndarray) -> None:
        """``dst = unzigzag(z) + bits(round(alpha * bf))``; ``dst`` may alias ``z`` or ``bf``."""
        # z = unzigzag(z) + bits(round(alpha * base)), a cache-sized block at a time; the prediction
        # is the encoder's exactly: the base widened to float64, one multiply, one rounding
        wide = typed("wide", np.float64, min(len(z), _BLOCK))
        pred = typed("block2", ftype, len(wide))
        work = typed("block", utype, len(wide))
        with np.errstate(all="ignore"):
            for s in range(0, len(z), _BLOCK):
                zz = z[s:s + _BLOCK]
                w, p = wide[:len(zz)], pred[:len(zz)]
                np.multiply(bf[s:s + _BLOCK], alpha, out=w, dtype=np.float64)
                np.copyto(p, w, casting="unsafe")
                unzigzag_add(zz, p.view(utype), out=dst[s:s + _BLOCK], scratch=work[:len(zz)])

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        out = np.empty(raw_len, dtype=np.uint8)
        self.decode_into(out.data, params, payload, base)
        return out  # type: ignore[return-value]  # a uint8 array: any bytes-like (Codec.decode)
