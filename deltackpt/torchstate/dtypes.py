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


# Quantized dtypes are refused, also on a plain tensor viewed as one (``t.view(torch.quint8)``, which
# has no quantizer): without scale and zero point their bytes mean nothing a uint8/int8/int32 view
# of the same bytes does not keep losslessly, torch deprecates them, and storing them would add
# format dtype names older readers refuse.  (Asking such a dtype ``is_signed`` raises RuntimeError.)
QUANTIZED = frozenset(d for d in (getattr(torch, n, None) for n in ("quint8", "qint8", "qint32", "quint4x2",
                                                                     "quint2x4")) if isinstance(d, torch.dtype))


def name_of(dtype: torch.dtype, path: str) -> str:
    try:
        return TO_NAME[dtype]
    except KeyError:
        pass
    if dtype in QUANTIZED:
        raise UnsupportedLeafError(f"{path}: quantized dtype {str(dtype).removeprefix('torch.')} is not supported; "
                                   "save its bytes as t.view(torch.uint8) (or int8/int32, the same element size), "
                                   "or a quantized tensor as t.int_repr() with t.q_scale() and t.q_zero_point()")
    raise UnsupportedLeafError(f"{path}: dtype {dtype} is not supported")


def dtype_of(name: str, path: str) -> torch.dtype:
    try:
        return FROM_NAME[name]
    except KeyError:
        raise UnsupportedLeafError(f"{path}: dtype {name!r} is not available in this torch build") from None
