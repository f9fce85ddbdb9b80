"""Encoding 3: integer difference of the bit patterns (new - base, wrapping), zigzag-mapped, then
byte-grouped zstd.  For floats that moved a little, the difference of their bit patterns is a
small integer even where XOR flips many mantissa bits (a carry across a binary boundary)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from ._delta_util import base_array
from .base import ChunkContext, Codec, Encoded
from .bytegroup import decode_planes, encode_planes, width_for

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _zigzag(d: np.ndarray, bits: int) -> np.ndarray:
    signed = d.view(f"i{bits // 8}")
    return ((d << 1) ^ (signed >> (bits - 1)).view(d.dtype)).astype(d.dtype, copy=False)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    return (z >> 1) ^ (-(z & 1).view(f"i{z.dtype.itemsize}")).view(z.dtype)


class SubDelta(Codec):
    encoding_id = 3
    name = "sub-delta"
    needs_base = True

    def encode(self, raw: bytes, ctx: ChunkContext, base: bytes | None = None) -> Encoded | None:
        w = width_for(ctx.itemsize, len(raw))
        if base is None or len(base) != len(raw) or w not in _UINT:
            return None
        t = _UINT[w]
        with np.errstate(over="ignore"):
            d = np.frombuffer(raw, dtype=t) - np.frombuffer(base, dtype=t)
            z = _zigzag(d, w * 8)
        params, payload = encode_planes(z.view(np.uint8), w, ctx.level)
        return Encoded(params, payload)

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes, base: bytes | None = None) -> None:
        # in place, one temporary: delta chains decode a link per version, so copies add up
        dest = np.frombuffer(out, dtype=np.uint8)
        b = base_array(base, len(dest), self.name)
        w = params.get("w")
        if not isinstance(w, int) or w not in _UINT:
            raise CorruptObjectError(f"{self.name}: width {w!r:.20} is not an integer size")
        decode_planes(params, payload, len(dest), what=self.name, out=dest)
        t = _UINT[w]
        z = dest.view(t)
        sign = z & 1
        np.right_shift(z, 1, out=z)
        np.negative(sign.view(f"i{w}"), out=sign.view(f"i{w}"))  # 0 -> 0, 1 -> all ones
        np.bitwise_xor(z, sign, out=z)
        np.add(z, b.view(t), out=z)  # wraps modulo 2^(8w), as the encoder's subtraction did

    def decode(self, params: dict[str, Any], payload: bytes, raw_len: int, base: bytes | None = None) -> bytes:
        out = np.empty(raw_len, dtype=np.uint8)
        self.decode_into(memoryview(out), params, payload, base)
        return out  # type: ignore[return-value]
