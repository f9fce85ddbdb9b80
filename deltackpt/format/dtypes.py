"""The dtype names the format knows, with their element sizes.  Torch-free on purpose:
a second reader in another language needs only this table."""

from __future__ import annotations

from ..errors import CorruptObjectError

# name -> (itemsize, kind).  kind: "f" IEEE-like float, "c" complex, "i" signed, "u" unsigned,
# "b" bool, "x" other bit patterns (float8/float4/bits/sub-byte ints) that only lossless codecs touch.
DTYPES: dict[str, tuple[int, str]] = {
    "float64": (8, "f"), "float32": (4, "f"), "float16": (2, "f"), "bfloat16": (2, "f"),
    "complex128": (16, "c"), "complex64": (8, "c"), "complex32": (4, "c"),
    "int64": (8, "i"), "int32": (4, "i"), "int16": (2, "i"), "int8": (1, "i"),
    "uint64": (8, "u"), "uint32": (4, "u"), "uint16": (2, "u"), "uint8": (1, "u"),
    "bool": (1, "b"),
    "float8_e4m3fn": (1, "x"), "float8_e4m3fnuz": (1, "x"), "float8_e5m2": (1, "x"),
    "float8_e5m2fnuz": (1, "x"), "float8_e8m0fnu": (1, "x"), "float4_e2m1fn_x2": (1, "x"),
    "bits8": (1, "x"), "bits16": (2, "x"), "bits1x8": (1, "x"), "bits2x4": (1, "x"), "bits4x2": (1, "x"),
    **{f"int{n}": (1, "x") for n in range(1, 8)},
    **{f"uint{n}": (1, "x") for n in range(1, 8)},
}


def itemsize(name: str, *, what: str = "tensor") -> int:
    """Element size of a format dtype name; unknown names are corrupt (or from a newer writer)."""
    try:
        return DTYPES[name][0]
    except (KeyError, TypeError):
        raise CorruptObjectError(f"{what}: unknown dtype {name!r:.40}") from None


def is_float(name: str) -> bool:
    """True for the float dtypes lossy codecs may quantize or cast."""
    return DTYPES.get(name, (0, ""))[1] == "f"
