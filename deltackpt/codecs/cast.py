"""Encodings 7 and 8: store float32/float64 values as float16 or bfloat16 (lossy, no base)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from .base import ChunkContext, Codec, Encoded
from .bytegroup import decode_planes, encode_planes
from .floats import from_float, max_abs_err, to_float


class Cast(Codec):
    lossless = False

    def __init__(self, encoding_id: int, target: str) -> None:
        self.encoding_id = encoding_id
        self.target = target
        self.name = "fp16" if target == "float16" else "bf16"

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded | None:
        if ctx.dtype not in ("float32", "float64") or not raw:
            return None
        src = to_float(raw, ctx.dtype)
        narrow = from_float(src, self.target)
        wide = to_float(narrow, self.target)
        if not np.array_equal(np.isfinite(wide), np.isfinite(src)):
            return None  # overflow to inf: keep the chunk exact instead
        recon = from_float(wide, ctx.dtype)
        params, payload = encode_planes(narrow, 2, ctx.level)
        params["dt"] = ctx.dtype
        return Encoded(params, payload, recon, max_abs_err(recon, raw, ctx.dtype))

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        dtype = params.get("dt")
        if dtype not in ("float32", "float64"):
            raise CorruptObjectError(f"{self.name}: source dtype {dtype!r:.20} is malformed")
        size = 4 if dtype == "float32" else 8
        if raw_len % size:
            raise CorruptObjectError(f"{self.name}: raw length {raw_len} is not a multiple of {size}")
        narrow = decode_planes(params, payload, raw_len // size * 2, what=self.name)
        return from_float(to_float(narrow, self.target), dtype)
