"""Interchange with single-file formats: write a loaded state to .pt / .safetensors, import one."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import DeltackptError


def flat_tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Dotted name -> tensor for every tensor in a nested state."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(state, torch.Tensor):
        out[prefix or "tensor"] = state
    elif isinstance(state, dict):
        for k, v in state.items():
            out.update(flat_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(flat_tensors(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def export_file(state: Any, path: str, *, version_id: str = "") -> int:
    """Write ``state`` to ``path`` (.safetensors: tensors only, dotted names; .pt: the whole state).
    Returns the number of tensors written.

    Example: ``export_file(deltackpt.load("ckpt", layers=["encoder"]), "encoder.safetensors")``"""
    tensors = flat_tensors(state)
    if path.endswith(".safetensors"):
        from safetensors.torch import save_file
        # safetensors refuses shared or strided tensors: give it private contiguous copies
        save_file({k: v.contiguous().clone() for k, v in tensors.items()}, path,
                  metadata={"deltackpt_version": version_id})
    elif path.endswith((".pt", ".pth", ".bin")):
        torch.save(state, path)
    else:
        raise DeltackptError(f"{path}: use a .pt or .safetensors file name")
    return len(tensors)


def import_file(path: str) -> Any:
    """Read a .safetensors file, or a .pt file with torch's restricted ``weights_only`` loader
    (which refuses arbitrary pickled objects)."""
    if not os.path.exists(path):
        raise DeltackptError(f"{path}: no such file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        return load_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ... for files it refuses
        raise DeltackptError(f"{path}: cannot import ({type(exc).__name__}: {str(exc)[:200]})") from None
