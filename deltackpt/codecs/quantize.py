"""Encodings 5 and 6: block-quantized deltas (int8 / int4 with one float32 scale per block).

The delta is taken against the DECODED base, so quantization error never accumulates along a
chain: every version is within one quantization step of its true value."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from ._delta_util import base_array
from .base import ChunkContext, Codec, Encoded
from .bytegroup import zstd_compress, zstd_decompress
from .floats import LOSSY_DTYPES, from_float, max_abs_err, to_float

BLOCK = 256
_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


class QuantizedDelta(Codec):
    needs_base = True
    lossless = False

    def __init__(self, encoding_id: int, bits: int) -> None:
        self.encoding_id = encoding_id
        self.bits = bits
        self.qmax = (1 << (bits - 1)) - 1
        self.name = f"q{bits}-delta"

    def _reconstruct(self, base_f: np.ndarray, q: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
        step = np.repeat(scales, BLOCK)[:n].astype(base_f.dtype)
        return base_f + q[:n].astype(base_f.dtype) * step

    def encode(self, raw: bytes, ctx: ChunkContext, base: bytes | None = None) -> Encoded | None:
        if ctx.dtype not in LOSSY_DTYPES or base is None or len(base) != len(raw) or not raw:
            return None
        new_f, base_f = to_float(raw, ctx.dtype), to_float(base, ctx.dtype)
        if not (np.isfinite(new_f).all() and np.isfinite(base_f).all()):
            return None  # non-finite values are kept exactly by a lossless codec
        n = len(new_f)
        nblocks = (n + BLOCK - 1) // BLOCK
        d = np.zeros(nblocks * BLOCK, dtype=base_f.dtype)
        d[:n] = new_f - base_f
        blocks = d.reshape(nblocks, BLOCK)
        scales = (np.abs(blocks).max(axis=1) / self.qmax).astype(np.float32)
        safe = np.where(scales > 0, scales, 1).astype(base_f.dtype)
        q = np.clip(np.rint(blocks / safe[:, None]), -self.qmax, self.qmax).astype(np.int8).reshape(-1)
        recon = from_float(self._reconstruct(base_f, q, scales, n), ctx.dtype)
        packed = q if self.bits == 8 else _pack4(q)
        payload = zstd_compress(scales.tobytes() + packed.tobytes(), ctx.level)
        return Encoded({"dt": ctx.dtype, "n": n}, payload, recon, max_abs_err(recon, raw, ctx.dtype))

    def decode(self, params: dict[str, Any], payload: bytes, raw_len: int, base: bytes | None = None) -> bytes:
        base_array(base, raw_len, self.name)
        dtype, n = params.get("dt"), params.get("n")
        if dtype not in LOSSY_DTYPES or not isinstance(n, int) or n < 0:
            raise CorruptObjectError(f"{self.name}: parameters are malformed")
        if raw_len % _ITEMSIZE[dtype]:
            raise CorruptObjectError(f"{self.name}: raw length {raw_len} is not a multiple of the {dtype} size")
        base_f = to_float(base, dtype)
        if len(base_f) != n:
            raise CorruptObjectError(f"{self.name}: {n} elements declared, base holds {len(base_f)}")
        nblocks = (n + BLOCK - 1) // BLOCK
        qbytes = nblocks * BLOCK if self.bits == 8 else nblocks * BLOCK // 2
        body = np.frombuffer(zstd_decompress(payload, nblocks * 4 + qbytes, what=self.name), dtype=np.uint8)
        scales = body[:nblocks * 4].view(np.float32)
        q = body[nblocks * 4:].view(np.int8) if self.bits == 8 else _unpack4(body[nblocks * 4:])
        return from_float(self._reconstruct(base_f, q, scales, n), dtype)


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
