"""The checkpoint systems compared: each saves one version into its own folder and reads it back.

A system has ``save(state, dir) -> bytes stored``, ``load(dir) -> state``, ``load_layer(dir, prefix)
-> {flat name: tensor}`` and ``close()`` (gives back whatever it holds between saves; a study calls
it, in ``finally``, before removing the folders).  deltackpt keeps every version in one repository
(``dir`` is then the repository, held open by one ``deltackpt.Repo`` from the first save to
``close()``, as a training loop holds it); every other system writes one file (DCP: one folder) per
version, which is how people use them.  Flat names join nested keys with "/"; the model's keys keep
their dots.  Only public APIs are used: deltackpt's, ``torch.distributed.checkpoint``'s, and the
file formats' own.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from typing import Any

import numpy as np
import torch

FILE = "ckpt"

# DCP in one process is the point of the comparison, not a mistake to warn about (its background
# save warns from its own thread, so the filter is the process's, not a catch_warnings block)
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def folder_bytes(d: str) -> int:
    """Bytes of every file under ``d`` (0 when it does not exist)."""
    return _size(d) if os.path.isdir(d) else 0


def torch_save_file(state: Any, path: str, fsync: bool) -> None:
    """``torch.save`` into a temp file renamed over ``path``; with ``fsync``, the file is durable
    before the rename (the fair anchor for a durable save)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


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

    def close(self) -> None:
        """Give back what the system holds between saves (deltackpt: its repository handles)."""

    def release(self, d: str) -> None:
        """Give back what the system holds for folder ``d`` only (before it is removed)."""

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
        torch_save_file(state, path, fsync=True)
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
        self._repos: dict[str, Any] = {}

    def repo(self, d: str):
        """The handle this system holds on repository ``d`` (opened, or created, on first use)."""
        import deltackpt
        d = os.path.abspath(d)
        if d not in self._repos:
            self._repos[d] = deltackpt.Repo.init(d, **({"delta_base": self.delta_base} if self.delta_base else {}))
        return self._repos[d]

    def save(self, state, d):
        # the repository's size right after the save returns is its size: work a save may leave
        # behind is the library's to bound, not the bench's to wait for
        before = folder_bytes(d)
        self.last = self.repo(d).save(state, step=int(state.get("step", 0)), encoding=self.encoding)
        return _size(d) - before

    def close(self):
        repos, self._repos = self._repos, {}
        for r in repos.values():
            r.close()

    def release(self, d):
        r = self._repos.pop(os.path.abspath(d), None)
        if r is not None:
            r.close()

    def _reader(self, d: str):
        """The held handle where the system saved into ``d``, else a temporary one (closed by the caller)."""
        import deltackpt
        held = self._repos.get(os.path.abspath(d))
        return (held, False) if held is not None else (deltackpt.Repo(d), True)

    def load(self, d, version="latest"):
        r, temporary = self._reader(d)
        try:
            return r.load(version)
        finally:
            if temporary:
                r.close()

    def load_layer(self, d, prefix, version="latest"):
        r, temporary = self._reader(d)
        try:
            t, _ = split(r.load(version, layers=[f"model.{prefix}"]))
        finally:
            if temporary:
                r.close()
        return t


def _aliases(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors with each storage once, and {dropped name: the name kept for the same tensor}
    (safetensors refuses shared storage; GPT-2 ties its output weights to the embedding)."""
    kept: dict[str, torch.Tensor] = {}
    first: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    for k, v in tensors.items():
        key = (v.data_ptr(), v.dtype, tuple(v.shape), tuple(v.stride()))
        if v.numel() and key in first:
            alias[k] = first[key]
        else:
            first.setdefault(key, k)
            kept[k] = v
    return kept, alias


class Safetensors(System):
    name = "safetensors"

    def save(self, state, d):
        from safetensors.torch import save_file
        os.makedirs(d, exist_ok=True)
        t, other = split(state)
        t, alias = _aliases(t)
        path = os.path.join(d, FILE + ".safetensors")
        save_file(t, path, metadata={"other": json.dumps(other), "alias": json.dumps(alias)})
        return os.path.getsize(path)

    def load(self, d):
        from safetensors import safe_open
        from safetensors.torch import load_file
        path = os.path.join(d, FILE + ".safetensors")
        out = dict(load_file(path))
        with safe_open(path, "pt") as f:
            meta = f.metadata()
        out.update({k: out[v] for k, v in json.loads(meta.get("alias", "{}")).items()})
        out.update(json.loads(meta["other"]))
        return out   # flat: rebuilding the nesting is the caller's job with this format

    def load_layer(self, d, prefix):
        from safetensors import safe_open
        with safe_open(os.path.join(d, FILE + ".safetensors"), "pt") as f:
            alias = json.loads(f.metadata().get("alias", "{}"))
            names = list(f.keys()) + list(alias)
            return {k: f.get_tensor(alias.get(k, k)) for k in layer_keys(names, prefix)}


class DCP(System):
    """``torch.distributed.checkpoint`` in one process (no process group): one folder per version,
    its files fsynced (FileSystemWriter's default).  A load needs no model: the tensors are
    allocated from the checkpoint's metadata, read by ``dcp.load`` and nested again by the paths
    the metadata records."""

    name = "dcp"

    def save(self, state, d):
        import torch.distributed.checkpoint as dcp
        dcp.save(state, checkpoint_id=d, no_dist=True)
        return _size(d)

    @staticmethod
    def _targets(d: str, want=None) -> tuple[dict[str, Any], dict[str, str]]:
        """Empty destinations for the checkpoint's entries (those whose flat name ``want`` accepts),
        and {DCP key: flat name}."""
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        md = FileSystemReader(d).read_metadata()
        paths = md.planner_data or {}
        flat_names = {k: "/".join(str(p) for p in paths.get(k, (k,))) for k in md.state_dict_metadata}
        out: dict[str, Any] = {}
        for k, m in md.state_dict_metadata.items():
            if want is not None and not want(flat_names[k]):
                continue
            out[k] = torch.empty(tuple(m.size), dtype=m.properties.dtype) if isinstance(m, TensorStorageMetadata) else None
        return out, flat_names

    @staticmethod
    def _read(d: str, targets: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        dcp.load(targets, checkpoint_id=d, no_dist=True)

    def load(self, d):
        targets, names = self._targets(d)
        self._read(d, targets)
        return {names[k]: v for k, v in targets.items()}   # flat, as safetensors'

    def load_layer(self, d, prefix):
        targets, names = self._targets(d)
        keep = set(layer_keys([names[k] for k in targets], prefix))
        targets = {k: v for k, v in targets.items() if names[k] in keep}
        self._read(d, targets)
        return {names[k]: v for k, v in targets.items()}

    def load_into(self, d: str, state: dict) -> None:
        """Read version ``d`` into ``state`` in place (a live rollback): its tensors are written
        where they are; a non-tensor entry under an integer key (SparseAdam's ``step``) comes back
        under the key's text, DCP's paths being text, and is moved back where it belongs."""
        self._read(d, state)
        _int_keys_back(state)


def _int_keys_back(obj: Any) -> None:
    """Merge each ``"3"`` entry DCP added into the dict under ``3`` beside it (recursively)."""
    if not isinstance(obj, dict):
        return
    for k in [k for k in obj if isinstance(k, str) and k.isdigit() and int(k) in obj]:
        added, live = obj.pop(k), obj[int(k)]
        if isinstance(added, dict) and isinstance(live, dict):
            live.update(added)
        else:
            obj[int(k)] = added
    for v in obj.values():
        _int_keys_back(v)


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
        # zipnn reorders its input's bytes in place: hand it a private copy, padded to whole
        # 4-byte words (an odd-length input corrupts its heap with bfloat16)
        pad = -len(raw) % 4
        data = bytearray(raw) + bytes(pad)
        return dtype.encode()[:1] + bytes([pad]) + bytes(self._z(dtype).compress(data))

    def decompress(self, blob):
        dtype = "bfloat16" if blob[:1] == b"b" else "float32"
        out = bytes(self._z(dtype).decompress(blob[2:]))
        return out[:len(out) - blob[1]]


#: the systems compared on states of a GB and more, where the single-stream compressors would
#: take minutes a version (ANCHORS.md's "At scale" columns, and HDF5 without compression)
AT_SCALE = ("deltackpt", "torch.save", "torch.save+fsync", "safetensors", "dcp", "hdf5")


def systems(names: "tuple[str, ...] | list[str] | None" = None, delta_base: str | None = None) -> list[System]:
    """Every system, or those ``names`` lists.  ``delta_base``: the config value deltackpt's
    repositories are created with (None: the library's default)."""
    full = [Deltackpt(delta_base=delta_base), Deltackpt("q8-delta", delta_base=delta_base), TorchSave(),
            TorchSave(durable=True), Safetensors(), DCP(), HDF5(None), HDF5("gzip"), HDF5("lzf"), Zstd(), ZipNN()]
    return full if names is None else [s for s in full if s.name in names]
