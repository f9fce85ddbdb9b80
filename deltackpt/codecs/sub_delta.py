"""Encoding 3: integer difference of the bit patterns (new - base, wrapping), zigzag-mapped, then
byte-grouped zstd.  For floats that moved a little, the difference of their bit patterns is a
small integer even where XOR flips many mantissa bits (a carry across a binary boundary)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import CorruptObjectError
from ._delta_util import base_array
from .base import ChunkContext, Codec, Encoded, is_int
from .buffers import buffer, typed
from .bytegroup import compress_planes, decode_planes, width_for

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


_BLOCK = 1 << 15  # elements per step: the scratch and the slices stay in the core's cache
_ENC_BLOCK = 1 << 17  # elements per encode step: fewer numpy calls (GIL held between them), still in L2


def unzigzag_add(z: np.ndarray, base: np.ndarray, out: np.ndarray | None = None, *, subtract: bool = False,
                 scratch: np.ndarray | None = None) -> None:
    """``out = unzigzag(z) + base`` (wrapping; ``out`` is ``z`` when None, and may be ``base``), a
    cache-sized block at a time; ``base - unzigzag(z)`` with ``subtract``.  ``z`` is overwritten.
    ``scratch``: ``min(len(z), _BLOCK)`` elements of z's dtype (default: this thread's block buffer)."""
    n = len(z)
    out = z if out is None else out
    scratch = typed("block", z.dtype, min(n, _BLOCK)) if scratch is None else scratch
    signed = scratch.view(f"i{z.dtype.itemsize}")
    for s in range(0, n, _BLOCK):
        zz, bb = z[s:s + _BLOCK], base[s:s + _BLOCK]
        m, ms = scratch[:len(zz)], signed[:len(zz)]
        np.bitwise_and(zz, 1, out=m)
        np.negative(ms, out=ms)  # 0 -> 0, 1 -> all ones
        np.right_shift(zz, 1, out=zz)
        np.bitwise_xor(zz, m, out=zz)
        if subtract:
            np.subtract(bb, zz, out=out[s:s + _BLOCK])
        else:
            np.add(zz, bb, out=out[s:s + _BLOCK])  # wraps modulo 2^(8w), as the encoder's subtraction did


def zigzag_delta_planes(a: np.ndarray, b: np.ndarray,
                        predict: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Byte planes (``w`` of them back to back, as :func:`compress_planes` takes them) of
    ``zigzag(a - predict(b))``, wrapping, for unsigned arrays ``a`` and ``b`` of element size ``w``
    (``predict`` maps a block of ``b`` to the same dtype; identity when None).

    One cache-sized block at a time, straight into the planes: the delta and its zigzag never
    exist as whole-chunk arrays, each of which was another pass over memory the training loop
    shares (-28% CPU on a 1.5 MB float32 chunk in cache; end to end the encode is bound by
    reading the chunk and its base from memory)."""
    w = a.dtype.itemsize
    n = len(a)
    out = np.empty(w * n, dtype=np.uint8)
    planes = out.reshape(w, n)
    d = typed("block", a.dtype, min(n, _ENC_BLOCK))
    m = typed("block2", a.dtype, min(n, _ENC_BLOCK))
    signed = f"i{w}"
    for s in range(0, n, _ENC_BLOCK):
        e = min(n, s + _ENC_BLOCK)
        db, mb = d[:e - s], m[:e - s]
        np.subtract(a[s:e], b[s:e] if predict is None else predict(b[s:e]), out=db)   # wraps modulo 2^(8w)
        np.right_shift(db.view(signed), w * 8 - 1, out=mb.view(signed))               # sign: 0 or all ones
        np.left_shift(db, 1, out=db)
        np.bitwise_xor(db, mb, out=db)                                                  # zigzag
        if w == 1:
            planes[0, s:e] = db
        else:
            for k in range(w):
                np.right_shift(db, 8 * k, out=planes[k, s:e], casting="unsafe")
    return out


class SubDelta(Codec):
    encoding_id = 3
    name = "sub-delta"
    needs_base = True
    invertible = True   # new = base + d modulo 2^(8w), so base = new - d

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded | None:
        w = width_for(ctx.itemsize, len(raw))
        if base is None or len(base) != len(raw) or w not in _UINT:
            return None
        t = _UINT[w]
        out = zigzag_delta_planes(np.frombuffer(raw, dtype=t), np.frombuffer(base, dtype=t))
        params, payload = compress_planes(out, w, ctx.level)
        return Encoded(params, payload)

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview, base: bytes | memoryview | None = None) -> None:
        # in place, one small scratch buffer: delta chains decode a link per version, so copies add up
        dest = np.frombuffer(out, dtype=np.uint8)
        b = base_array(base, len(dest), self.name)
        w = params.get("w")
        if not is_int(w) or w not in _UINT:
            raise CorruptObjectError(f"{self.name}: width {w!r:.20} is not an integer size")
        decode_planes(params, payload, len(dest), what=self.name, out=dest)
        t = _UINT[w]
        unzigzag_add(dest.view(t), b.view(t))

    def apply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        self._step(out, params, payload, subtract=False)

    def unapply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        self._step(out, params, payload, subtract=True)

    def _step(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview, *, subtract: bool) -> None:
        """``out`` (the base, or the delta's result to undo) += or -= the decoded differences, in place."""
        dest = np.frombuffer(out, dtype=np.uint8)
        w = params.get("w")
        if not is_int(w) or w not in _UINT:
            raise CorruptObjectError(f"{self.name}: width {w!r:.20} is not an integer size")
        z = decode_planes(params, payload, len(dest), what=self.name, out=buffer("delta", len(dest)))
        t = _UINT[w]
        unzigzag_add(z.view(t), dest.view(t), out=dest.view(t), subtract=subtract)

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        out = np.empty(raw_len, dtype=np.uint8)
        self.decode_into(out.data, params, payload, base)
        return out  # type: ignore[return-value]  # a uint8 array: any bytes-like (Codec.decode)
