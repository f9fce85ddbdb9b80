"""Raw bytes of tensors, without copies where the tensor is already contiguous on the CPU."""

from __future__ import annotations

import numpy as np
import torch


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted as an integer dtype of the same width (a view, strides kept).  torch
    has no copy kernels for sub-byte, bits and some float8 dtypes; integer views copy everywhere."""
    same = _SAME_WIDTH_INT.get(t.element_size())
    return t.view(same) if same is not None and t.dtype != same else t


def byte_view(t: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy array over ``t``'s elements in row-major order (copies only when
    ``t`` is non-contiguous or not on the CPU)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        t = bits_of(t).to("cpu").contiguous()
    if t.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


def storage_view(t: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy array over ``t``'s whole untyped storage (for sharing groups)."""
    storage = t.untyped_storage()
    if storage.device.type != "cpu":
        storage = storage.cpu()
    if storage.nbytes() == 0:
        return np.empty(0, dtype=np.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def from_bytes(buf: np.ndarray, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A tensor over the uint8 array ``buf`` (no copy) with the given dtype and shape."""
    if len(buf) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(buf).view(dtype).reshape(shape)


def writable_bytes(t: torch.Tensor) -> np.ndarray | None:
    """A uint8 numpy array aliasing ``t``'s memory, when ``t`` is a contiguous CPU tensor."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return None
    return t.detach().reshape(-1).view(torch.uint8).numpy()
