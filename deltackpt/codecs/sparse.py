"""Encoding 4: only the rows that changed.  A bitmap of changed rows (zstd) and the XOR of those
rows against the base (byte-grouped zstd).  Pays for embedding tables where an interval touches
a few rows, frozen rows, and pruned weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from ._delta_util import base_array, xor_into
from .base import ChunkContext, Codec, Encoded, is_int
from .buffers import buffer
from .bytegroup import decode_planes, encode_planes, width_for, zstd_compress, zstd_decompress

MAX_CHANGED_FRACTION = 0.5  # above this, a dense delta is as small and cheaper to decode


def _row_bytes(ctx_row: int, itemsize: int, raw_len: int) -> int:
    row = ctx_row if ctx_row and raw_len % ctx_row == 0 else itemsize
    return row if row and raw_len % row == 0 else 1


_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _nonzero_rows(x: np.ndarray) -> np.ndarray:
    """Which rows of the (rows, rb) uint8 array ``x`` hold a non-zero byte.  In words rather than
    bytes: ``any(axis=1)`` over bytes reduces short rows element by element (0.28 ms for a 2 MiB
    chunk of 256-byte rows, against 0.15 ms OR-ing them as 64-bit words; bench/DELTAS.md, "Which rows
    a sparse delta takes")."""
    rb = x.shape[1]
    if rb in _WORDS:
        return x.view(_WORDS[rb])[:, 0] != 0
    if rb % 8 == 0:
        return np.not_equal(np.bitwise_or.reduce(x.view(np.uint64), axis=1), 0)
    return np.asarray(x.any(axis=1))


class SparseRows(Codec):
    encoding_id = 4
    name = "sparse"
    needs_base = True
    invertible = True   # new = base with the same rows XORed, so base = new with them XORed again

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded | None:
        if base is None or len(base) != len(raw) or not raw:
            return None
        rb = _row_bytes(ctx.row_bytes, ctx.itemsize, len(raw))
        nrows = len(raw) // rb
        if nrows >= 256:
            # most chunks of a training run change everywhere: look at every 16th row before paying
            # for the whole chunk
            a = np.frombuffer(raw, dtype=np.uint8).reshape(nrows, rb)[::16]
            b = np.frombuffer(base, dtype=np.uint8).reshape(nrows, rb)[::16]
            if (a != b).any(axis=1).mean() > MAX_CHANGED_FRACTION:
                return None
        x = xor_into(raw, base, buffer("delta", len(raw))).reshape(-1, rb)
        changed = _nonzero_rows(x)
        count = int(changed.sum())
        if count > MAX_CHANGED_FRACTION * len(x):   # one flag per row
            return None
        bitmap = zstd_compress(np.packbits(changed).tobytes(), ctx.level)
        rows = x[changed].reshape(-1)
        params, values = encode_planes(rows, width_for(ctx.itemsize, len(rows)) if len(rows) else 1, ctx.level)
        params.update({"rb": rb, "n": count, "bm": len(bitmap)})
        return Encoded(params, bitmap + values)

    def _rows(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(indices of the changed rows, their XOR as a (count, rb) array in this thread's buffer, rb),
        every parameter checked against ``raw_len`` before anything is allocated."""
        rb, count, bm = params.get("rb"), params.get("n"), params.get("bm")
        if (not (is_int(rb) and is_int(count) and is_int(bm)) or rb <= 0 or raw_len % rb
                or bm < 0 or bm > len(payload)):
            raise CorruptObjectError(f"{self.name}: parameters are malformed")
        nrows = raw_len // rb
        if not 0 <= count <= nrows:
            raise CorruptObjectError(f"{self.name}: {count} changed rows of {nrows}")
        bitmap = np.frombuffer(zstd_decompress(payload[:bm], (nrows + 7) // 8, what=self.name), dtype=np.uint8)
        index = np.flatnonzero(np.unpackbits(bitmap, count=nrows))
        if len(index) != count:
            raise CorruptObjectError(f"{self.name}: bitmap marks {len(index)} rows, header says {count}")
        rows = decode_planes(params, memoryview(payload)[bm:], count * rb, what=self.name,
                             out=buffer("rows", count * rb))
        return index, rows.reshape(count, rb), rb

    def apply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        """Only the changed rows are touched: a chain of sparse deltas costs what its rows cost."""
        dest = np.frombuffer(out, dtype=np.uint8)
        index, rows, rb = self._rows(params, payload, len(dest))
        table = dest.reshape(-1, rb)
        table[index] ^= rows

    def unapply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        self.apply_into(out, params, payload)  # XOR of the same rows is its own inverse

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview, base: bytes | memoryview | None = None) -> None:
        dest = np.frombuffer(out, dtype=np.uint8)
        b = base_array(base, len(dest), self.name)
        index, rows, rb = self._rows(params, payload, len(dest))
        if not np.shares_memory(dest, b):
            dest[:] = b
        table = dest.reshape(-1, rb)
        table[index] ^= rows

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        out = np.empty(raw_len, dtype=np.uint8)
        self.decode_into(out.data, params, payload, base)
        return out  # type: ignore[return-value]  # a uint8 array: any bytes-like (Codec.decode)
