"""Interchange with single-file formats: write a loaded state to .pt / .safetensors, import one.

Both directions take a path from the user and data that may come from a stranger, so every
failure is typed and names the file (and tensor): a missing folder, a directory, a corrupt file,
or a strided view whose materialized copy (safetensors stores only contiguous data) would not fit
in memory or on the disk, found before anything is allocated."""

from __future__ import annotations

import os
import shutil
import stat
from typing import Any

import torch

from ..errors import DeltackptError, FileAccessError, ForeignFileError, OutOfMemoryError


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
    folder = check_output(path)
    tensors = flat_tensors(state)
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.torch import save_file
        standalone = _standalone(tensors, path, folder)
        try:
            save_file(standalone, path, metadata={"deltackpt_version": version_id})
        except (OSError, SafetensorError) as exc:  # I/O inside its Rust writer comes as SafetensorError
            raise FileAccessError(f"{path}: cannot write ({_short(exc)})") from None
        return len(tensors)
    try:
        torch.save(state, path)
    except (OSError, RuntimeError) as exc:  # torch's zip writer reports I/O failures as RuntimeError
        if _out_of_memory(exc):
            raise OutOfMemoryError(f"{path}: out of memory while writing ({_short(exc)})") from None
        raise FileAccessError(f"{path}: cannot write ({_short(exc)})") from None
    return len(tensors)


def check_output(path: str) -> str:
    """Refuse an output path export_file cannot write, before anything is loaded for it;
    returns its folder."""
    if not path.endswith((".safetensors", ".pt", ".pth", ".bin")):
        raise DeltackptError(f"{path}: use a .pt or .safetensors file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileAccessError(f"{path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise FileAccessError(f"{path}: is a folder; name a file to write")
    return folder


def _standalone(tensors: dict[str, torch.Tensor], path: str, folder: str) -> dict[str, torch.Tensor]:
    """What safetensors accepts: contiguous tensors owning their storage.  A view (shared,
    strided, or stride 0 over one element) is copied; the copies' total is checked against free
    memory and disk first, because a 4-byte stored view may claim 2^40 elements."""
    owners: dict[int, int] = {}
    for t in tensors.values():
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            owners[ptr] = owners.get(ptr, 0) + 1
    copy = {name for name, t in tensors.items()
            if not t.numel() or (not t.is_contiguous() or owners[t.untyped_storage().data_ptr()] > 1
                              or t.untyped_storage().nbytes() != t.numel() * t.element_size())}
    need = {name: tensors[name].numel() * tensors[name].element_size() for name in copy}
    total = sum(tensors[n].numel() * tensors[n].element_size() for n in tensors)
    if need:
        largest = max(need, key=need.__getitem__)
        t = tensors[largest]
        avail = available_memory()
        if avail is not None and sum(need.values()) > avail:
            raise OutOfMemoryError(
                f"{path}: tensor {largest} (shape {list(t.shape)}, stride {list(t.stride())}) is a view that "
                f"safetensors must store as {need[largest]} contiguous bytes; the copies need "
                f"{sum(need.values())} bytes, {avail} are available (restore to .pt, which keeps views, "
                "or select --layer)")
    free = shutil.disk_usage(folder).free
    if total > free:
        raise FileAccessError(f"{path}: the tensors need {total} bytes as safetensors, the disk has {free} free")
    out = {}
    for name, t in tensors.items():
        if name not in copy:
            out[name] = t
            continue
        try:
            out[name] = t.contiguous().clone() if not t.is_contiguous() else t.clone()
        except (RuntimeError, MemoryError) as exc:
            if isinstance(exc, MemoryError) or _out_of_memory(exc):
                raise OutOfMemoryError(f"{path}: cannot allocate {need[name]} bytes to copy tensor {name} "
                                       f"(shape {list(t.shape)})") from None
            raise
    return out


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, capped by a cgroup v2 limit; None
    when the system does not say (the allocation itself is then the check)."""
    avail: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        if limit != "max":
            room = max(0, int(limit) - current)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def _out_of_memory(exc: BaseException) -> bool:
    return "allocate" in str(exc) and "memory" in str(exc).lower()


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def import_file(path: str) -> Any:
    """Read a .safetensors file, or a .pt file with torch's restricted ``weights_only`` loader
    (which refuses arbitrary pickled objects)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileAccessError(f"{path}: {exc.strerror or 'cannot be read'}") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileAccessError(f"{path}: is a folder; name a .pt or .safetensors file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
        raise FileAccessError(f"{path}: not a regular file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            return load_file(path)
        except OSError as exc:
            raise FileAccessError(f"{path}: cannot read ({_short(exc)})") from None
        except Exception as exc:  # SafetensorError: a header or offsets that do not parse
            raise ForeignFileError(f"{path}: not a valid .safetensors file ({_short(exc)})") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise FileAccessError(f"{path}: cannot read ({_short(exc)})") from None
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ... for files it refuses
        raise ForeignFileError(f"{path}: cannot import ({_short(exc)})") from None
