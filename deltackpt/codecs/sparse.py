"""Encoding 4: only the rows that changed.  A bitmap of changed rows (zstd) and the XOR of those
rows against the base (byte-grouped zstd).  Pays for embedding tables where an interval touches
a few rows, frozen rows, and pruned weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from ._delta_util import base_array, xor_bytes
from .base import ChunkContext, Codec, Encoded, is_int
from .bytegroup import decode_planes, encode_planes, width_for, zstd_compress, zstd_decompress

MAX_CHANGED_FRACTION = 0.5  # above this, a dense delta is as small and cheaper to decode


def _row_bytes(ctx_row: int, itemsize: int, raw_len: int) -> int:
    row = ctx_row if ctx_row and raw_len % ctx_row == 0 else itemsize
    return row if row and raw_len % row == 0 else 1


class SparseRows(Codec):
    encoding_id = 4
    name = "sparse"
    needs_base = True
    invertible = True   # the stored rows are XORs: applying them twice gives the base back

    def encode(self, raw: bytes, ctx: ChunkContext, base: bytes | None = None) -> Encoded | None:
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
        x = xor_bytes(raw, base).reshape(-1, rb)
        changed = x.any(axis=1)
        count = int(changed.sum())
        if count > MAX_CHANGED_FRACTION * len(changed):
            return None
        bitmap = zstd_compress(np.packbits(changed).tobytes(), ctx.level)
        rows = x[changed].reshape(-1)
        params, values = encode_planes(rows, width_for(ctx.itemsize, len(rows)) if len(rows) else 1, ctx.level)
        params.update({"rb": rb, "n": count, "bm": len(bitmap)})
        return Encoded(params, bitmap + values)

    def _parse(self, params: dict[str, Any], payload: bytes, raw_len: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(row bytes, changed-row mask, the changed rows' XOR as a (count, rb) array), all checked
        against ``raw_len`` and the payload before anything chunk-sized is allocated."""
        rb, count, bm = params.get("rb"), params.get("n"), params.get("bm")
        if (not all(is_int(v) for v in (rb, count, bm)) or rb <= 0 or raw_len % rb
                or bm < 0 or bm > len(payload)):
            raise CorruptObjectError(f"{self.name}: parameters are malformed")
        nrows = raw_len // rb
        if not 0 <= count <= nrows:
            raise CorruptObjectError(f"{self.name}: {count} changed rows of {nrows}")
        changed = np.unpackbits(np.frombuffer(zstd_decompress(payload[:bm], (nrows + 7) // 8, what=self.name),
                                              dtype=np.uint8), count=nrows).astype(bool)
        if int(changed.sum()) != count:
            raise CorruptObjectError(f"{self.name}: bitmap marks {int(changed.sum())} rows, header says {count}")
        rows = decode_planes(params, payload[bm:], count * rb, what=self.name)
        return rb, changed, rows.reshape(count, rb)

    def apply_into(self, out: memoryview, params: dict[str, Any], payload: bytes) -> None:
        # only the changed rows are touched: a chain of sparse deltas costs about its bytes
        rb, changed, rows = self._parse(params, payload, len(out))
        arr = np.frombuffer(out, dtype=np.uint8).reshape(-1, rb)
        arr[changed] ^= rows

    def unapply_into(self, out: memoryview, params: dict[str, Any], payload: bytes) -> None:
        self.apply_into(out, params, payload)  # XOR of the changed rows is its own inverse

    def decode(self, params: dict[str, Any], payload: bytes, raw_len: int, base: bytes | None = None) -> bytes:
        b = base_array(base, raw_len, self.name)
        rb, changed, rows = self._parse(params, payload, raw_len)
        out = b.copy().reshape(-1, rb)
        out[changed] ^= rows
        return out.tobytes()
