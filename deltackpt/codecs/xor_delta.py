"""Encoding 2: XOR with the base chunk, then byte-grouped zstd.

Unchanged high bytes (sign, exponent) XOR to zero, so the exponent planes nearly vanish."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._delta_util import base_array, xor_bytes
from .base import ChunkContext, Codec, Encoded
from .bytegroup import decode_planes, encode_planes, scratch, width_for


class XorDelta(Codec):
    encoding_id = 2
    name = "xor-delta"
    needs_base = True
    invertible = True

    def encode(self, raw: bytes, ctx: ChunkContext, base: bytes | None = None) -> Encoded | None:
        if base is None or len(base) != len(raw):
            return None
        params, payload = encode_planes(xor_bytes(raw, base), width_for(ctx.itemsize, len(raw)), ctx.level)
        return Encoded(params, payload)

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes, base: bytes | None = None) -> None:
        dest = np.frombuffer(out, dtype=np.uint8)
        b = base_array(base, len(dest), self.name)
        decode_planes(params, payload, len(dest), what=self.name, out=dest)
        if len(dest) % 8 == 0:
            np.bitwise_xor(dest.view(np.uint64), b.view(np.uint64), out=dest.view(np.uint64))
        else:
            np.bitwise_xor(dest, b, out=dest)

    def apply_into(self, out: memoryview, params: dict[str, Any], payload: bytes) -> None:
        dest = np.frombuffer(out, dtype=np.uint8)
        x = decode_planes(params, payload, len(dest), what=self.name, out=scratch(len(dest)))
        if len(dest) % 8 == 0:
            np.bitwise_xor(dest.view(np.uint64), x.view(np.uint64), out=dest.view(np.uint64))
        else:
            np.bitwise_xor(dest, x, out=dest)

    def unapply_into(self, out: memoryview, params: dict[str, Any], payload: bytes) -> None:
        self.apply_into(out, params, payload)  # XOR is its own inverse: new ^ x = base

    def decode(self, params: dict[str, Any], payload: bytes, raw_len: int, base: bytes | None = None) -> bytes:
        b = base_array(base, raw_len, self.name)
        return xor_bytes(decode_planes(params, payload, raw_len, what=self.name), b)  # type: ignore[return-value]
