"""Raw bytes of tensors, without copies where the tensor is already contiguous on the CPU."""

from __future__ import annotations

import threading

import numpy as np
import torch

_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted as an integer dtype of the same width (a view, strides kept).  torch
    has no copy kernels for sub-byte, bits and some float8 dtypes; integer views copy everywhere."""
    same = _SAME_WIDTH_INT.get(t.element_size())
    return t.view(same) if same is not None and t.dtype != same else t


class StagedSource:
    """The bytes of a device tensor (CUDA...), copied to the host a range at a time through a
    reused staging buffer (pinned when CUDA is available), so saving a GPU state never holds a
    host copy of a whole tensor.  The saver calls ``read_range(start, end)`` per chunk.

    Example::

        src = StagedSource(gpu_tensor)
        first_mib = src.read_range(0, 1 << 20)
    """

    def __init__(self, t: torch.Tensor, *, pin: bool | None = None) -> None:
        flat = bits_of(t.detach())
        if not flat.is_contiguous():
            flat = flat.contiguous()  # on the device: costs device memory, not host memory
        self._flat = flat.reshape(-1).view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        self._pin = torch.cuda.is_available() if pin is None else pin
        self._local = threading.local()

    def __len__(self) -> int:
        return self._flat.numel()

    def _buffer(self, n: int) -> torch.Tensor:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < n:
            buf = torch.empty(n, dtype=torch.uint8, pin_memory=self._pin)
            self._local.buf = buf
        return buf

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``: device -> (pinned) staging buffer -> bytes."""
        n = end - start
        stage = self._buffer(n)[:n]
        stage.copy_(self._flat[start:end])  # synchronous: the buffer is reused right after
        return stage.numpy().tobytes()


def byte_view(t: torch.Tensor) -> "np.ndarray | StagedSource":
    """A flat uint8 numpy array over ``t``'s elements in row-major order (copies only when
    ``t`` is non-contiguous); for a tensor off the CPU, a :class:`StagedSource` that the saver
    reads chunk by chunk."""
    if t.device.type not in ("cpu", "meta"):
        return StagedSource(t)
    if not t.is_contiguous():
        t = bits_of(t).contiguous()
    if t.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


def storage_view(t: torch.Tensor) -> "np.ndarray | StagedSource":
    """A flat uint8 numpy array over ``t``'s whole untyped storage (for sharing groups)."""
    storage = t.untyped_storage()
    if storage.device.type != "cpu":
        return StagedSource(torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage))
    if storage.nbytes() == 0:
        return np.empty(0, dtype=np.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def from_bytes(buf: "np.ndarray | torch.Tensor", dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A tensor over the flat uint8 array or tensor ``buf`` (no copy, on ``buf``'s device) with
    the given dtype and shape."""
    base = buf if isinstance(buf, torch.Tensor) else torch.from_numpy(buf)
    if len(buf) == 0:
        return torch.empty(shape, dtype=dtype, device=base.device)
    return base.view(dtype).reshape(shape)


def writable_bytes(t: torch.Tensor) -> np.ndarray | None:
    """A uint8 numpy array aliasing ``t``'s memory, when ``t`` is a contiguous CPU tensor."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return None
    return t.detach().reshape(-1).view(torch.uint8).numpy()
