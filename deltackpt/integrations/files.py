"""Interchange with single-file formats: write a loaded state to .pt / .safetensors, import one.

Both directions take a path from the user and data that may come from a stranger, so every
failure is typed and names the file (and tensor): a missing folder, a directory, a corrupt file,
or a strided view whose materialized copy (safetensors stores only contiguous data) would not fit
in memory or on the disk, found before anything is allocated."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
from types import FrameType
from typing import Any, Iterator

import torch

from ..errors import DeltackptError, FileAccessError, ForeignFileError, OutOfMemoryError, UnsupportedLeafError
from ..format.limits import MAX_MSGPACK_DEPTH


def flat_tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Dotted name -> tensor for every tensor in a nested state, in order (an explicit stack: any
    depth a save accepts)."""
    out: dict[str, torch.Tensor] = {}
    stack: list[tuple[str, Any]] = [(prefix, state)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, torch.Tensor):
            out[name or "tensor"] = value
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
        stack.extend(reversed([(f"{name}.{k}" if name else str(k), v) for k, v in items]))
    return out


# what safetensors stores; a dtype it lacks is refused before the file is written (its own error
# is a bare KeyError naming the dtype)
_SAFETENSORS_DTYPES = frozenset(getattr(torch, n) for n in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64",
    "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float4_e2m1fn_x2") if hasattr(torch, n))


def _safetensors_dtypes() -> frozenset:
    """The dtypes the installed safetensors writes (its own table when it has one)."""
    try:
        from safetensors.torch import _SIZE   # not public: a missing or renamed table means the list above
        return frozenset(k for k in _SIZE if isinstance(k, torch.dtype))
    except ImportError:
        return _SAFETENSORS_DTYPES


def _check_safetensors_dtypes(tensors: dict[str, torch.Tensor], path: str) -> None:
    held = _safetensors_dtypes()
    for name, t in tensors.items():
        if t.dtype not in held:
            raise UnsupportedLeafError(f"{path}: tensor {name} is {str(t.dtype).removeprefix('torch.')}, which "
                                       "safetensors cannot hold; restore to a .pt file, which keeps every dtype "
                                       "(or select other tensors with --layer)")


def export_file(state: Any, path: str, *, version_id: str = "") -> int:
    """Write ``state`` to ``path`` (.safetensors: tensors only, dotted names; .pt: the whole state).
    Returns the number of tensors written.  All or nothing: the file is written under a temporary
    name beside ``path`` and renamed over it once complete, so a failure leaves ``path`` as it was.

    Example: ``export_file(deltackpt.load("ckpt", layers=["encoder"]), "encoder.safetensors")``"""
    folder = check_output(path)
    tensors = flat_tensors(state)
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.torch import save_file
        _check_safetensors_dtypes(tensors, path)
        standalone = _standalone(tensors, path, folder)
        with _replacing(path) as tmp:
            try:
                save_file(standalone, tmp, metadata={"deltackpt_version": version_id})
            except (OSError, SafetensorError) as exc:  # I/O inside its Rust writer comes as SafetensorError
                raise FileAccessError(f"{path}: cannot write ({_short(exc)})") from None
        return len(tensors)
    with _replacing(path) as tmp:
        try:
            with _deep_pickling():
                torch.save(state, tmp)
        except (OSError, RuntimeError) as exc:  # torch's zip writer reports I/O failures as RuntimeError
            if _out_of_memory(exc):
                raise OutOfMemoryError(f"{path}: out of memory while writing ({_short(exc)})") from None
            raise FileAccessError(f"{path}: cannot write ({_short(exc)})") from None
    return len(tensors)


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[str]:
    """A temporary name beside ``path``, renamed over it when the body succeeds, removed otherwise."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _frames() -> int:
    """How many frames deep the caller runs."""
    f: FrameType | None
    n, f = 0, sys._getframe()
    while f is not None:
        n, f = n + 1, f.f_back
    return n


@contextlib.contextmanager
def _deep_pickling() -> Iterator[None]:
    """Room on Python's stack for pickle to write any tree a save accepts: the pickler spends about
    two of the interpreter's recursion levels per level of nesting (a state 512 dicts deep needs
    ~1100, above the default limit of 1000)."""
    need = 4 * MAX_MSGPACK_DEPTH + 200 + _frames()
    old = sys.getrecursionlimit()
    if old < need:
        sys.setrecursionlimit(need)
    try:
        yield
    finally:
        if old < need:
            sys.setrecursionlimit(old)


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
