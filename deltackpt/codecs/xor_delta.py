"""Encoding 2: XOR with the base chunk, then byte-grouped zstd.

Unchanged high bytes (sign, exponent) XOR to zero, so the exponent planes nearly vanish."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._delta_util import base_array, xor_into
from .base import ChunkContext, Codec, Encoded
from .buffers import buffer
from .bytegroup import decode_planes, encode_planes, width_for


class XorDelta(Codec):
    encoding_id = 2
    name = "xor-delta"
    needs_base = True
    invertible = True

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded | None:
        if base is None or len(base) != len(raw):
            return None
        # the XOR goes to this thread's buffer, grouped from there into the payload: one chunk-sized
        # allocation (the payload) instead of two
        x = xor_into(raw, base, buffer("delta", len(raw)))
        params, payload = encode_planes(x, width_for(ctx.itemsize, len(raw)), ctx.level)
        return Encoded(params, payload)

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview, base: bytes | memoryview | None = None) -> None:
        dest = np.frombuffer(out, dtype=np.uint8)
        b = base_array(base, len(dest), self.name)
        decode_planes(params, payload, len(dest), what=self.name, out=dest)
        xor_into(dest, b, dest)

    def apply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        dest = np.frombuffer(out, dtype=np.uint8)
        x = decode_planes(params, payload, len(dest), what=self.name, out=buffer("delta", len(dest)))
        xor_into(dest, x, dest)

    def unapply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        self.apply_into(out, params, payload)  # XOR is its own inverse: new ^ x = base

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        b = base_array(base, raw_len, self.name)
        out = decode_planes(params, payload, raw_len, what=self.name)
        return xor_into(out, b, out)  # type: ignore[return-value]  # a uint8 array: any bytes-like
