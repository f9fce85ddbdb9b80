"""Frozen encoding ids.  An id, once released, keeps its meaning forever; new codecs take new ids."""

from __future__ import annotations

from ..errors import CodecError, CorruptObjectError
from .base import Codec
from .cast import Cast
from .quantize import QuantizedDelta
from .raw import Raw
from .scaled_delta import ScaledDelta
from .scaled_quantize import ScaledQuantizedDelta
from .sparse import SparseRows
from .sub_delta import SubDelta
from .xor_delta import XorDelta
from .zstd import ByteGroupZstd

(RAW, BG_ZSTD, XOR_DELTA, SUB_DELTA, SPARSE, Q8_DELTA, Q4_DELTA, CAST_FP16, CAST_BF16, SCALED_DELTA,
 Q8_SCALED_DELTA, Q4_SCALED_DELTA) = range(12)

_CODECS: dict[int, Codec] = {c.encoding_id: c for c in (
    Raw(), ByteGroupZstd(), XorDelta(), SubDelta(), SparseRows(),
    QuantizedDelta(Q8_DELTA, 8), QuantizedDelta(Q4_DELTA, 4),
    Cast(CAST_FP16, "float16"), Cast(CAST_BF16, "bfloat16"), ScaledDelta(),
    ScaledQuantizedDelta(Q8_SCALED_DELTA, 8), ScaledQuantizedDelta(Q4_SCALED_DELTA, 4),
)}
_BY_NAME = {c.name: c for c in _CODECS.values()}


def get(encoding_id: int) -> Codec:
    """The codec for a stored encoding id; unknown ids are corrupt or from a newer writer."""
    try:
        return _CODECS[encoding_id]
    except KeyError:
        raise CorruptObjectError(f"unknown encoding id {encoding_id} (written by a newer deltackpt?)") from None


def by_name(name: str) -> Codec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise CodecError(f"unknown encoding {name!r}; known: {sorted(_BY_NAME)}") from None


def all_codecs() -> list[Codec]:
    return list(_CODECS.values())
