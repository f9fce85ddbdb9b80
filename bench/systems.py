"""The checkpoint systems compared: each saves one version into its own folder and reads it back.

A system has ``save(state, dir) -> bytes stored``, ``load(dir) -> state`` and ``load_layer(dir, prefix)
-> {flat name: tensor}``.  deltackpt keeps every version in one repository (``dir`` is then the
repository and versions are addressed by a counter); every other system writes one file per version,
which is how people use them.  Flat names join nested keys with "/"; the model's keys keep their dots.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np
import torch

FILE = "ckpt"


# ---------- flat view of a nested training state (for formats that only hold named arrays) ----------

def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{"a/b/0": leaf} for nested dicts/lists; leaves are tensors or JSON-able scalars."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}/"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}/"))
    else:
        out[prefix[:-1]] = obj
    return out


def split(state: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    flat = flatten(state)
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    other = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return tensors, other


def layer_keys(names, prefix: str) -> list[str]:
    """Tensors of the model under a module prefix (same rule as deltackpt's ``layers=``)."""
    p = f"model/{prefix}"
    return [n for n in names if n == p or n.startswith(p + ".")]


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _size(d: str) -> int:
    total = 0
    for r, _, fs in os.walk(d):
        for f in fs:
            try:
                total += os.path.getsize(os.path.join(r, f))
            except FileNotFoundError:
                pass  # a temp file renamed or removed meanwhile
    return total


class System:
    name = "?"
    versioned = False   # True: all versions in one folder (deltackpt)
    lossless = True

    def save(self, state: Any, d: str) -> int:
        raise NotImplementedError

    def load(self, d: str) -> Any:
        raise NotImplementedError

    def settle(self) -> None:
        """Wait, untimed, for work the save left running in the background."""

    def load_layer(self, d: str, prefix: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class TorchSave(System):
    name = "torch.save"

    def __init__(self, durable: bool = False):
        self.durable = durable
        if durable:
            self.name = "torch.save+fsync"

    def save(self, state, d):
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, FILE + ".pt")
        if not self.durable:
            torch.save(state, path)
            return os.path.getsize(path)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(d)
        return os.path.getsize(path)

    def load(self, d):
        return torch.load(os.path.join(d, FILE + ".pt"), weights_only=True)

    def load_layer(self, d, prefix):
        # torch.load(mmap=True) then copy only the layer's tensors (the pages actually read)
        st = torch.load(os.path.join(d, FILE + ".pt"), weights_only=True, mmap=True)
        t, _ = split(st)
        return {k: t[k].clone() for k in layer_keys(t, prefix)}


class Deltackpt(System):
    versioned = True

    def __init__(self, encoding: str | None = None, delta_base: str | None = None):
        self.encoding = encoding
        self.delta_base = delta_base
        self.last = None   # the Version the last save made (its id, written_bytes)
        self.name = "deltackpt" if encoding is None else f"deltackpt-{encoding.split('-')[0]}"
        self.lossless = encoding is None

    def save(self, state, d):
        import deltackpt
        before = _size(d) if os.path.isdir(d) else 0
        if not before and self.delta_base is not None:
            deltackpt.Repo.init(d, delta_base=self.delta_base)
        self.last = deltackpt.save(state, d, step=int(state.get("step", 0)), encoding=self.encoding)
        return _size(d) - before

    def settle(self):
        # the deltification a save starts in the background (idle priority): finished before the
        # next timed operation, so it neither runs inside one nor leaves the size half-way
        from deltackpt.repo.write import background
        background.wait_all_idle(600.0)

    def load(self, d, version="latest"):
        import deltackpt
        return deltackpt.load(d, version)

    def load_layer(self, d, prefix, version="latest"):
        import deltackpt
        t, _ = split(deltackpt.load(d, version, layers=[f"model.{prefix}"]))
        return t


class Safetensors(System):
    name = "safetensors"

    def save(self, state, d):
        from safetensors.torch import save_file
        os.makedirs(d, exist_ok=True)
        t, other = split(state)
        path = os.path.join(d, FILE + ".safetensors")
        save_file(t, path, metadata={"other": json.dumps(other)})
        return os.path.getsize(path)

    def load(self, d):
        from safetensors import safe_open
        from safetensors.torch import load_file
        path = os.path.join(d, FILE + ".safetensors")
        out = dict(load_file(path))
        with safe_open(path, "pt") as f:
            out.update(json.loads(f.metadata()["other"]))
        return out   # flat: rebuilding the nesting is the caller's job with this format

    def load_layer(self, d, prefix):
        from safetensors import safe_open
        with safe_open(os.path.join(d, FILE + ".safetensors"), "pt") as f:
            return {k: f.get_tensor(k) for k in layer_keys(list(f.keys()), prefix)}


class HDF5(System):
    def __init__(self, compression: str | None):
        self.compression = compression
        self.name = f"hdf5-{compression}+shuffle" if compression else "hdf5"

    def save(self, state, d):
        import h5py
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, FILE + ".h5")
        t, other = split(state)
        with h5py.File(path, "w") as f:
            f.attrs["other"] = json.dumps(other)
            for k, v in t.items():
                v = v.detach().contiguous()
                dt = str(v.dtype)
                if v.dtype == torch.bfloat16:    # h5py has no bf16: store its 2-byte words
                    v = v.view(torch.int16)
                a = v.numpy().reshape(-1)
                kw = dict(compression=self.compression, shuffle=True) if self.compression and a.size > 1 else {}
                ds = f.create_dataset(k.replace("/", "|"), data=a, **kw)
                ds.attrs["dtype"] = dt
                ds.attrs["shape"] = list(v.shape)
        return os.path.getsize(path)

    @staticmethod
    def _read(ds) -> torch.Tensor:
        t = torch.from_numpy(ds[()].copy() if ds.shape else np.array(ds[()]))
        dt = ds.attrs["dtype"]
        if dt == "torch.bfloat16":
            t = t.view(torch.bfloat16)
        return t.reshape(tuple(ds.attrs["shape"]))

    def load(self, d):
        import h5py
        with h5py.File(os.path.join(d, FILE + ".h5"), "r") as f:
            out = {k.replace("|", "/"): self._read(f[k]) for k in f.keys()}
            out.update(json.loads(f.attrs["other"]))
        return out

    def load_layer(self, d, prefix):
        import h5py
        with h5py.File(os.path.join(d, FILE + ".h5"), "r") as f:
            names = [k.replace("|", "/") for k in f.keys()]
            return {k: self._read(f[k.replace("/", "|")]) for k in layer_keys(names, prefix)}


class _BytesCodec(System):
    """Compress the torch.save bytes of the state as one blob (written with fsync like deltackpt)."""

    ext = ".bin"

    def compress(self, raw: bytes, state) -> bytes:
        raise NotImplementedError

    def decompress(self, blob: bytes) -> bytes:
        raise NotImplementedError

    def save(self, state, d):
        os.makedirs(d, exist_ok=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = self.compress(buf.getbuffer(), state)
        path = os.path.join(d, FILE + self.ext)
        with open(path, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        return len(blob)

    def load(self, d):
        with open(os.path.join(d, FILE + self.ext), "rb") as f:
            raw = self.decompress(f.read())
        return torch.load(io.BytesIO(raw), weights_only=True)

    def load_layer(self, d, prefix):
        t, _ = split(self.load(d))   # a compressed stream has to be decoded whole
        return {k: t[k] for k in layer_keys(t, prefix)}


class Zstd(_BytesCodec):
    name = "zstd-3"
    ext = ".pt.zst"

    def compress(self, raw, state):
        import zstandard
        return zstandard.ZstdCompressor(level=3).compress(raw)

    def decompress(self, blob):
        import zstandard
        return zstandard.ZstdDecompressor().decompress(blob)


class ZipNN(_BytesCodec):
    name = "zipnn"
    ext = ".pt.znn"

    def _z(self, dtype: str):
        from zipnn import ZipNN as Z
        return Z(input_format="byte", bytearray_dtype=dtype, threads=1)

    def compress(self, raw, state):
        t, _ = split(state)
        bf16 = any(v.dtype == torch.bfloat16 for v in t.values())
        dtype = "bfloat16" if bf16 else "float32"
        # zipnn reorders its input's bytes in place: hand it a private copy
        return dtype.encode()[:1] + bytes(self._z(dtype).compress(bytearray(raw)))

    def decompress(self, blob):
        dtype = "bfloat16" if blob[:1] == b"b" else "float32"
        return bytes(self._z(dtype).decompress(blob[1:]))


def systems(scale: bool = False, delta_base: str | None = None) -> list[System]:
    """All systems; at the 2 GB scale point the slow single-stream compressors are left out.
    ``delta_base``: the config value deltackpt's repositories are created with (None: the default)."""
    full = [Deltackpt(delta_base=delta_base), Deltackpt("q8-delta", delta_base=delta_base), TorchSave(), TorchSave(durable=True), Safetensors(),
            HDF5(None), HDF5("gzip"), HDF5("lzf"), Zstd(), ZipNN()]
    if scale:
        return [s for s in full if s.name in ("deltackpt", "torch.save", "torch.save+fsync", "safetensors", "hdf5")]
    return full
