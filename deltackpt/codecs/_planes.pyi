"""Types of the compiled loops in _planes.c (any C-contiguous buffer of bytes is taken)."""

from collections.abc import Sequence
from typing import Union

import numpy as np

_Bytes = Union[bytes, bytearray, memoryview, np.ndarray]

def interleave(out: _Bytes, planes: Sequence[_Bytes], /) -> None:
    """out[i * w + k] = planes[k][i], w = len(planes), n = len(out) // w (every length checked)."""

def group(data: _Bytes, out: _Bytes, width: int, /) -> None:
    """out[k * n + i] = data[i * width + k] (every length checked)."""
