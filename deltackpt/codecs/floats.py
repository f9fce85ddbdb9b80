"""Float views of raw bytes for the lossy codecs (numpy has no bfloat16)."""

from __future__ import annotations

import numpy as np

from ..errors import CodecError

LOSSY_DTYPES = ("float64", "float32", "float16", "bfloat16")


def to_float(raw: bytes | memoryview | np.ndarray, dtype: str) -> np.ndarray:
    """Decode raw bytes of ``dtype`` into float32 (float64 for float64 sources)."""
    b = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    if dtype == "float64":
        return b.view(np.float64)
    if dtype == "float32":
        return b.view(np.float32)
    if dtype == "float16":
        return b.view(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    raise CodecError(f"lossy codecs handle {LOSSY_DTYPES}, not {dtype}")


def from_float(values: np.ndarray, dtype: str) -> bytes:
    # overflow to inf on narrowing is expected: callers check finiteness of what comes back
    with np.errstate(over="ignore", invalid="ignore"):
        return _from_float(values, dtype)


def _from_float(values: np.ndarray, dtype: str) -> bytes:
    """Round ``values`` to ``dtype`` (nearest even) and return its raw bytes."""
    if dtype == "float64":
        return values.astype(np.float64).tobytes()
    if dtype == "float32":
        return values.astype(np.float32).tobytes()
    if dtype == "float16":
        return values.astype(np.float16).tobytes()
    if dtype == "bfloat16":
        u = values.astype(np.float32).view(np.uint32)
        rounded = ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
        nan = np.isnan(values)
        if nan.any():
            rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
        return rounded.tobytes()
    raise CodecError(f"lossy codecs handle {LOSSY_DTYPES}, not {dtype}")


def max_abs_err(recon: bytes | memoryview, raw: bytes | memoryview, dtype: str) -> float:
    """Largest |recon - raw| over the elements; equal infinities and NaN-for-NaN count as exact, so the
    recorded figure stays finite (a lossy codec never turns a finite value non-finite or back)."""
    with np.errstate(invalid="ignore", over="ignore"):
        a = to_float(recon, dtype).astype(np.float64)
        b = to_float(raw, dtype).astype(np.float64)
    if not len(a):
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    diff[same] = 0.0
    return float(np.max(diff))
