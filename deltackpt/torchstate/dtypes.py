"""torch dtype <-> format dtype name."""

from __future__ import annotations

import torch

from ..errors import UnsupportedLeafError
from ..format.dtypes import DTYPES

TO_NAME: dict[torch.dtype, str] = {}
FROM_NAME: dict[str, torch.dtype] = {}
for _name in DTYPES:
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        TO_NAME[_dt] = _name
        FROM_NAME[_name] = _dt


def name_of(dtype: torch.dtype, path: str) -> str:
    try:
        return TO_NAME[dtype]
    except KeyError:
        hint = " (quantized tensors: save t.dequantize() or t.int_repr() with the scale)" if dtype.is_signed is not None and "q" in str(dtype) else ""
        raise UnsupportedLeafError(f"{path}: dtype {dtype} is not supported{hint}") from None


def dtype_of(name: str, path: str) -> torch.dtype:
    try:
        return FROM_NAME[name]
    except KeyError:
        raise UnsupportedLeafError(f"{path}: dtype {name!r} is not available in this torch build") from None
