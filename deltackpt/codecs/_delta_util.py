"""Shared checks for codecs that take a base chunk."""

from __future__ import annotations

import numpy as np

from ..errors import CorruptObjectError


def base_array(base: bytes | memoryview | None, raw_len: int, name: str) -> np.ndarray:
    if base is None or len(base) != raw_len:
        raise CorruptObjectError(f"{name}: base chunk of {None if base is None else len(base)} bytes, expected {raw_len}")
    return np.frombuffer(base, dtype=np.uint8)


def xor_into(a: bytes | memoryview | np.ndarray, b: bytes | memoryview | np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = a XOR b`` (uint8 arrays or bytes of one length; ``out`` may be ``a`` or ``b``), on
    8-byte words where the length allows; returns ``out``."""
    x = np.frombuffer(a, dtype=np.uint8) if not isinstance(a, np.ndarray) else a
    y = np.frombuffer(b, dtype=np.uint8) if not isinstance(b, np.ndarray) else b
    if len(x) % 8 == 0:
        np.bitwise_xor(x.view(np.uint64), y.view(np.uint64), out=out.view(np.uint64))
    else:
        np.bitwise_xor(x, y, out=out)
    return out
