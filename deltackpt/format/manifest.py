"""Version manifests: what one saved version holds.

    manifest = MAGIC(8) || msgpack map (schema below);  version id = xxh3-128 hex of the whole file

The tree is the saved object with every tensor replaced by ext type 1 (its index in ``tensors``)
and every tuple by ext type 2 (a msgpack array); ``tree.py`` packs and unpacks them.  Tensors are
views of blobs: a blob is a run of raw bytes cut into chunks; unshared tensors own one blob each,
tensors sharing storage share one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from ..errors import CorruptObjectError, FormatVersionError, LimitExceededError
from . import msgpack_io
from .dtypes import itemsize
from .ids import check_raw_id, from_hex, hex_id
from .limits import MAX_CHUNK_BYTES, MAX_MANIFEST_BYTES, MAX_MSGPACK_DEPTH, MAX_NDIM, MAX_TENSOR_ELEMENTS
from .tree import EXT_TENSOR, EXT_TUPLE, TensorRef as TensorRef, TupleBudget, pack_tree, unpack_tree  # noqa: F401 (re-exported)

MAGIC = b"DCKMAN\x01\x00"


@dataclass
class ChunkRef:
    chunk_id: bytes
    raw_len: int


@dataclass
class Blob:
    """Raw bytes of one tensor (or one shared storage), cut into row-aligned chunks."""

    nbytes: int
    itemsize: int
    row_bytes: int
    chunks: list[ChunkRef]

    def to_obj(self) -> dict:
        return {"nbytes": self.nbytes, "itemsize": self.itemsize, "row_bytes": self.row_bytes,
                "chunks": [[c.chunk_id, c.raw_len] for c in self.chunks]}

    @classmethod
    def from_obj(cls, obj: Any, what: str) -> "Blob":
        _expect_map(obj, what, {"nbytes", "itemsize", "row_bytes", "chunks"})
        nbytes = msgpack_io.expect_int(obj["nbytes"], f"{what}.nbytes", 0, MAX_TENSOR_ELEMENTS * 16)
        isz = msgpack_io.expect_int(obj["itemsize"], f"{what}.itemsize", 1, 16)
        row = msgpack_io.expect_int(obj["row_bytes"], f"{what}.row_bytes", 0, MAX_TENSOR_ELEMENTS * 16)
        chunks_raw = obj["chunks"]
        if not isinstance(chunks_raw, list):
            raise CorruptObjectError(f"{what}.chunks is not an array")
        chunks = []
        total = 0
        for i, c in enumerate(chunks_raw):
            if not isinstance(c, list) or len(c) != 2:
                raise CorruptObjectError(f"{what}.chunks[{i}] is not [id, length]")
            n = msgpack_io.expect_int(c[1], f"{what}.chunks[{i}] length", 0, MAX_CHUNK_BYTES)
            chunks.append(ChunkRef(check_raw_id(c[0]), n))
            total += n
        if total != nbytes:
            raise CorruptObjectError(f"{what}: chunk lengths sum to {total}, not {nbytes}")
        return cls(nbytes, isz, row, chunks)


@dataclass
class TensorEntry:
    """One tensor leaf: a typed, shaped view into a blob."""

    name: str
    key: list
    dtype: str
    shape: list[int]
    stride: list[int]
    blob: int
    offset: int  # in bytes, into the blob
    encoding: str = "lossless"
    exact: bool = True
    max_abs_err: float = 0.0
    device: str = "cpu"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)

    def to_obj(self) -> dict:
        return {"name": self.name, "key": self.key, "dtype": self.dtype, "shape": self.shape,
                "stride": self.stride, "blob": self.blob, "offset": self.offset, "encoding": self.encoding,
                "exact": self.exact, "max_abs_err": self.max_abs_err, "device": self.device}

    @classmethod
    def from_obj(cls, obj: Any, what: str, blobs: list[Blob]) -> "TensorEntry":
        _expect_map(obj, what, {"name", "key", "dtype", "shape", "stride", "blob", "offset"})
        name, key = obj["name"], obj["key"]
        if (not isinstance(name, str) or not isinstance(key, list) or len(key) > MAX_MSGPACK_DEPTH
                or not all(isinstance(k, (str, int)) for k in key)):
            raise CorruptObjectError(f"{what}: name/key malformed")
        what = f"tensor {name!r}"
        isz = itemsize(obj["dtype"], what=what)
        shape, stride = obj["shape"], obj["stride"]
        if not isinstance(shape, list) or not isinstance(stride, list) or len(shape) > MAX_NDIM or len(stride) != len(shape):
            raise CorruptObjectError(f"{what}: shape/stride malformed")
        for d in shape:
            msgpack_io.expect_int(d, f"{what} shape", 0, MAX_TENSOR_ELEMENTS)
        for s in stride:
            msgpack_io.expect_int(s, f"{what} stride", 0, MAX_TENSOR_ELEMENTS)
        numel = 1
        for d in shape:
            numel *= d
            if numel > MAX_TENSOR_ELEMENTS:
                raise LimitExceededError(f"{what}: {shape} has more than {MAX_TENSOR_ELEMENTS} elements")
        b = msgpack_io.expect_int(obj["blob"], f"{what} blob", 0, len(blobs) - 1) if blobs else None
        if b is None:
            raise CorruptObjectError(f"{what}: refers to a blob but the manifest has none")
        off = msgpack_io.expect_int(obj["offset"], f"{what} offset", 0, blobs[b].nbytes)
        if numel:
            span = (sum((d - 1) * s for d, s in zip(shape, stride)) + 1) * isz
            if off % isz or off + span > blobs[b].nbytes:
                raise CorruptObjectError(f"{what}: view of {span} bytes at {off} lies outside its blob of {blobs[b].nbytes}")
        err = obj.get("max_abs_err", 0.0)
        if not isinstance(err, (int, float)) or isinstance(err, bool):
            raise CorruptObjectError(f"{what}: max_abs_err malformed")
        enc, dev = obj.get("encoding", "lossless"), obj.get("device", "cpu")
        exact = obj.get("exact", True)
        if not isinstance(enc, str) or not isinstance(dev, str) or not isinstance(exact, bool):
            raise CorruptObjectError(f"{what}: encoding/device/exact malformed")
        return cls(name, obj["key"], obj["dtype"], shape, stride, b, off, enc, exact, float(err), dev)


@dataclass
class Manifest:
    """Everything one version holds.  ``tree`` contains TensorRef and tuple values."""

    parent: str | None
    time: float
    tree: Any
    tensors: list[TensorEntry]
    blobs: list[Blob]
    step: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    meta: Any = None
    writer: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return all(t.exact for t in self.tensors)

    def to_bytes(self) -> bytes:
        body = {
            "parent": self.parent, "time": self.time, "step": self.step, "metrics": self.metrics,
            "meta": self.meta, "writer": self.writer, "extra": self.extra,
            "blobs": [b.to_obj() for b in self.blobs],
            "tensors": [t.to_obj() for t in self.tensors],
            "tree": self.tree,
        }
        return MAGIC + pack_tree(body)

    def version_id(self) -> str:
        return hex_id(self.to_bytes())


def _expect_map(obj: Any, what: str, keys: set[str]) -> None:
    if not isinstance(obj, dict):
        raise CorruptObjectError(f"{what} is not a map")
    missing = keys - obj.keys()
    if missing:
        raise CorruptObjectError(f"{what} lacks {sorted(missing)}")


def _checked_bytes(data: bytes, version_id: str | None, what: str) -> None:
    if len(data) > MAX_MANIFEST_BYTES:
        raise LimitExceededError(f"{what}: {len(data)} bytes exceeds the limit")
    # the id is the hash of every byte: checked first, so a flipped version byte reads as damage
    # (CorruptObjectError) and only an intact manifest from a newer writer as FormatVersionError
    if version_id is not None and hex_id(data) != version_id:
        raise CorruptObjectError(f"{what}: content hash does not match its id")
    if len(data) < len(MAGIC) or data[:6] != MAGIC[:6]:
        raise CorruptObjectError(f"{what}: missing manifest magic")
    if data[:8] != MAGIC:
        raise FormatVersionError(f"{what}: manifest version {data[6]} is not supported by this reader (version 1)")


def _head_fields(parent: Any, t: Any, step: Any, metrics: Any, what: str) -> tuple[str | None, float, int | None, dict]:
    if parent is not None:
        if not isinstance(parent, str):
            raise CorruptObjectError(f"{what}: parent is not a string")
        from_hex(parent)
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        raise CorruptObjectError(f"{what}: time is not a number")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise CorruptObjectError(f"{what}: step is not an integer")
    metrics = metrics or {}
    if not isinstance(metrics, dict):
        raise CorruptObjectError(f"{what}: metrics is not a map")
    return parent, float(t), step, metrics


_HEAD_KEYS = ("parent", "time", "step", "metrics")


def _top_fields(data: bytes, version_id: str | None, what: str) -> dict[str, memoryview]:
    """The manifest's top-level fields, each as its undecoded msgpack bytes (msgpack skips them in
    C), after the checks of the whole file (size, hash, magic); the required ones must be there."""
    _checked_bytes(data, version_id, what)
    body = memoryview(data)[len(MAGIC):]
    n = len(body)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(n, 1), max_bin_len=n,
                                max_str_len=n, max_array_len=n, max_map_len=n, max_ext_len=n)
    unpacker.feed(body)
    found: dict[str, memoryview] = {}
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            start = unpacker.tell()
            unpacker.skip()
            if isinstance(key, str):
                found[key] = body[start:unpacker.tell()]
        if unpacker.tell() != n:
            raise CorruptObjectError(f"{what}: bytes after the manifest")
    except CorruptObjectError:
        raise
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            msgpack.OutOfData, RecursionError, OverflowError) as exc:
        raise CorruptObjectError(f"{what}: undecodable msgpack ({type(exc).__name__}: {exc})") from None
    missing = {"parent", "time", "tree", "tensors", "blobs"} - found.keys()
    if missing:
        raise CorruptObjectError(f"{what} lacks {sorted(missing)}")
    return found


def _field_values(found: dict[str, memoryview], keys: tuple[str, ...], what: str,
                  refs: list[int] | None = None) -> dict[str, Any]:
    """Fields ``keys`` of :func:`_top_fields`, each decoded as the whole manifest's decoder decodes
    it (exts, depth, limits; one tuple budget for all), absent ones left out."""
    budget = TupleBudget()
    seen: list[int] = [] if refs is None else refs
    return {k: unpack_tree(found[k], what=what, max_bytes=MAX_MANIFEST_BYTES, refs=seen, start=0, budget=budget)
            for k in keys if k in found}


class _Parts(NamedTuple):
    """What every reader of a whole manifest's fields checks first (:func:`_checked_parts`)."""

    values: dict[str, Any]      # the fields decoded with their exts (all but blobs and tensors)
    blobs: list                 # the blobs and tensors as plain msgpack, each still to be checked
    tensors: list
    head: tuple[str | None, float, int | None, dict]
    extra: dict[str, Any]


def _checked_parts(found: dict[str, memoryview], keys: tuple[str, ...], what: str) -> _Parts:
    """Fields ``keys`` decoded (:func:`_field_values`); ``blobs`` and ``tensors`` as arrays of plain
    msgpack (they hold no ext a reader decodes: decoded in C, checked field by field by the caller);
    every tensor reference in those fields within ``tensors``; the head and ``extra`` checked."""
    refs: list[int] = []
    values = _field_values(found, keys, what, refs)
    blobs = msgpack_io.unpack(found["blobs"], what=what, max_bytes=MAX_MANIFEST_BYTES)
    tensors = msgpack_io.unpack(found["tensors"], what=what, max_bytes=MAX_MANIFEST_BYTES)
    if not isinstance(blobs, list) or not isinstance(tensors, list):
        raise CorruptObjectError(f"{what}: blobs/tensors are not arrays")
    for idx in refs:
        if idx >= len(tensors):
            raise CorruptObjectError(f"{what}: tree refers to tensor {idx} of {len(tensors)}")
    head = _head_fields(values.get("parent"), values.get("time"), values.get("step"), values.get("metrics"), what)
    extra = values.get("extra") or {}
    if not isinstance(extra, dict):
        raise CorruptObjectError(f"{what}: extra is not a map")
    return _Parts(values, blobs, tensors, head, extra)


def decode_head(data: bytes, *, version_id: str | None = None) -> tuple[str | None, float, int | None, dict]:
    """A manifest's (parent, time, step, metrics), checked as :func:`decode` checks them, without
    building its tree, tensors and blobs: msgpack skips them in C.  What orders a history and what
    retention reads; a process that opens a long history reads every version's (300 manifests of
    320 tensors: 3.3 s decoded whole, ~30 ms so).  The rest of the manifest is checked when the
    version is read."""
    what = f"manifest {version_id}" if version_id else "manifest"
    values = _field_values(_top_fields(data, version_id, what), _HEAD_KEYS, what)
    return _head_fields(values.get("parent"), values.get("time"), values.get("step"), values.get("metrics"), what)


@dataclass(frozen=True)
class ManifestSummary:
    """What a listing of versions shows of one (``deltackpt log``): its head, ``meta`` and
    ``extra``, whether every tensor is exact, and the bytes its blobs hold; and its ``tree`` (with
    :class:`TensorRef` placeholders), which says what the version holds (a ``model`` entry...)."""

    parent: str | None
    time: float
    step: int | None
    metrics: dict[str, Any]
    meta: Any
    extra: dict[str, Any]
    exact: bool
    logical_bytes: int
    tree: Any = None

    @classmethod
    def of(cls, m: "Manifest") -> "ManifestSummary":
        """The summary of a manifest already decoded whole."""
        return cls(m.parent, m.time, m.step, m.metrics, m.meta, m.extra, m.exact, sum(b.nbytes for b in m.blobs), m.tree)


def decode_summary(data: bytes, *, version_id: str | None = None) -> ManifestSummary:
    """A manifest's :class:`ManifestSummary`, without building its tensors and blobs.

    Checked as :func:`decode` checks them: the whole file (size, hash, magic), the head, ``meta``,
    ``extra`` and the tree (exts, depth, limits, tensor references within ``tensors``), each blob's
    ``nbytes`` and each tensor's ``exact``; what it does not read (chunk lists, shapes, views) is
    checked when the version is read.  Every manifest :func:`decode` accepts is summarized alike
    (fuzz/fuzz_manifest.py checks it).  Why: a listing of a long history decoded every manifest
    whole (a 320-tensor manifest: 5.8 ms of CPU, where this takes 1.4 ms; ``python -m bench
    history_growth`` times the listing).

    Example::

        s = decode_summary(open(path, "rb").read(), version_id=vid)
        print(s.step, s.logical_bytes, s.exact)
    """
    what = f"manifest {version_id}" if version_id else "manifest"
    p = _checked_parts(_top_fields(data, version_id, what), _HEAD_KEYS + ("tree", "meta", "extra"), what)
    logical = 0
    for i, b in enumerate(p.blobs):
        _expect_map(b, f"{what} blob {i}", {"nbytes"})
        logical += msgpack_io.expect_int(b["nbytes"], f"{what} blob {i}.nbytes", 0, MAX_TENSOR_ELEMENTS * 16)
    exact = True
    for i, x in enumerate(p.tensors):
        _expect_map(x, f"{what} tensor {i}", set())
        flag = x.get("exact", True)
        if not isinstance(flag, bool):
            raise CorruptObjectError(f"{what} tensor {i}: encoding/device/exact malformed")
        exact = exact and flag
    return ManifestSummary(*p.head, p.values.get("meta"), p.extra, exact, logical, p.values.get("tree"))


def decode(data: bytes, *, version_id: str | None = None) -> Manifest:
    """Parse and schema-check a manifest.  With ``version_id``, the content hash is checked too.

    Every top-level field but ``blobs`` and ``tensors`` is decoded with its exts, depth and tuple
    limits (:func:`~.tree.unpack_tree`, one tuple budget for all).  Those two hold no ext a reader
    decodes and a schema of scalars and flat lists, so plain msgpack decodes them (in C) and
    :meth:`Blob.from_obj` / :meth:`TensorEntry.from_obj` check every field of theirs (a 320-tensor
    manifest walked its 50,000 values in Python for the depth check: 5.8 -> 3.2 ms of CPU)."""
    what = f"manifest {version_id}" if version_id else "manifest"
    found = _top_fields(data, version_id, what)
    p = _checked_parts(found, tuple(k for k in found if k not in ("blobs", "tensors")), what)
    blobs = [Blob.from_obj(b, f"{what} blob {i}") for i, b in enumerate(p.blobs)]
    tensors = [TensorEntry.from_obj(x, f"{what} tensor {i}", blobs) for i, x in enumerate(p.tensors)]
    parent, t, step, metrics = p.head
    writer = p.values.get("writer", "")
    return Manifest(parent, t, p.values["tree"], tensors, blobs, step, metrics, p.values.get("meta"),
                    writer if isinstance(writer, str) else "", p.extra)
