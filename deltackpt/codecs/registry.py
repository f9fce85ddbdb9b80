"""Frozen encoding ids.  An id, once released, keeps its meaning forever; new codecs take new ids.

A codec's module is imported the first time its id is asked for: a restart that reads keyframes
imports ``raw`` and ``zstd`` only, not the delta and lossy codecs (bench/RESTART.md, stop 49).
"""

from __future__ import annotations

import importlib

from ..errors import CodecError, CorruptObjectError
from .base import Codec

(RAW, BG_ZSTD, XOR_DELTA, SUB_DELTA, SPARSE, Q8_DELTA, Q4_DELTA, CAST_FP16, CAST_BF16, SCALED_DELTA,
 Q8_SCALED_DELTA, Q4_SCALED_DELTA) = range(12)

# id: (name, module, class, arguments); tests/codecs/test_registry.py checks each against its codec
_MAKERS: dict[int, tuple[str, str, str, tuple]] = {
    RAW: ("raw", "raw", "Raw", ()),
    BG_ZSTD: ("bg-zstd", "zstd", "ByteGroupZstd", ()),
    XOR_DELTA: ("xor-delta", "xor_delta", "XorDelta", ()),
    SUB_DELTA: ("sub-delta", "sub_delta", "SubDelta", ()),
    SPARSE: ("sparse", "sparse", "SparseRows", ()),
    Q8_DELTA: ("q8-delta", "quantize", "QuantizedDelta", (Q8_DELTA, 8)),
    Q4_DELTA: ("q4-delta", "quantize", "QuantizedDelta", (Q4_DELTA, 4)),
    CAST_FP16: ("fp16", "cast", "Cast", (CAST_FP16, "float16")),
    CAST_BF16: ("bf16", "cast", "Cast", (CAST_BF16, "bfloat16")),
    SCALED_DELTA: ("scaled-delta", "scaled_delta", "ScaledDelta", ()),
    Q8_SCALED_DELTA: ("q8-scaled-delta", "scaled_quantize", "ScaledQuantizedDelta", (Q8_SCALED_DELTA, 8)),
    Q4_SCALED_DELTA: ("q4-scaled-delta", "scaled_quantize", "ScaledQuantizedDelta", (Q4_SCALED_DELTA, 4)),
}
_BY_NAME = {name: encoding_id for encoding_id, (name, *_rest) in _MAKERS.items()}
_MADE: dict[int, Codec] = {}   # one instance per id, made at first use


def get(encoding_id: int) -> Codec:
    """The codec for a stored encoding id; unknown ids are corrupt or from a newer writer.

    Example::

        codec = get(BG_ZSTD)
    """
    try:
        return _MADE[encoding_id]
    except (KeyError, TypeError):
        pass
    try:
        _name, module, cls, args = _MAKERS[encoding_id]
    except (KeyError, TypeError):
        raise CorruptObjectError(f"unknown encoding id {encoding_id!r:.40} (written by a newer deltackpt?)") from None
    made = getattr(importlib.import_module(f".{module}", __package__), cls)(*args)
    # two threads asking at once both make one; the first kept is the one every caller gets
    return _MADE.setdefault(encoding_id, made)


def by_name(name: str) -> Codec:
    """The codec called ``name`` (a config's or CLI's spelling); unknown names list the known ones."""
    try:
        return get(_BY_NAME[name])
    except KeyError:
        raise CodecError(f"unknown encoding {name!r}; known: {sorted(_BY_NAME)}") from None


def all_codecs() -> list[Codec]:
    """Every codec, in id order (imports them all)."""
    return [get(i) for i in _MAKERS]
