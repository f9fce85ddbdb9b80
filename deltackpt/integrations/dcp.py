"""torch.distributed.checkpoint (DCP) storage on a deltackpt repository.

``dcp.save(state, storage_writer=Writer(repo))`` and ``dcp.load(state, storage_reader=Reader(repo))``
work unchanged, with any planner, world size and sharding DCP supports:

- every rank hashes, dedups, delta-encodes and packs the items DCP's planner gave it, in parallel,
  into its own packs and index file (content addressing: a chunk another rank or an earlier
  version already stored is not written again; replicated tensors are written once because DCP's
  planner gives each to one rank, and would be deduplicated by chunk id if not);
- the coordinator alone commits, in ``finish`` once every rank's write results have arrived: one
  manifest, then ``latest``.  Until then no version is visible; a rank that dies mid-save leaves
  only unreferenced packs, which gc removes after its grace period;
- DCP's metadata (tensor sizes, shard offsets, planner data) is stored in the manifest as plain
  msgpack, never pickled; ``read_data`` serves byte ranges of the saved shards, so loading into a
  different world size (resharding) reads only the chunks that overlap what each rank asks for.

Example::

    import torch.distributed.checkpoint as dcp
    from deltackpt.dcp import Reader, Writer

    dcp.save({"model": model.state_dict()}, storage_writer=Writer("s3://bucket/run1", step=100))
    dcp.load(state, storage_reader=Reader("s3://bucket/run1", version="latest~1"))
"""

from __future__ import annotations

import io
import math
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner,
                                                  WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ..api import Repo, internal, portable_location
from ..api.internal import Blob, BlobInput, Manifest, SaveStats, Store, TensorEntry, TensorRef
from ..errors import CorruptObjectError, StateMismatchError, UnsupportedLeafError
from ..torchstate.dtypes import dtype_of, name_of
from ..torchstate.flatten import contiguous_strides, metrics_of
from ..torchstate.tensor_bytes import byte_view

DCP_TREE_KEY = "dcp"
DCP_LAYOUT = 1


@dataclass
class _Stored:
    """What one rank wrote for one write item (travels to the coordinator through DCP's gather)."""

    blob: Blob
    dtype: str
    shape: list[int]
    is_bytes: bool
    written_bytes: int


def _plain(value: Any, what: str) -> Any:
    """DCP planner data as plain msgpack values (tuples kept as tuples); anything else refused."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, dict):
        return {_plain(k, what): _plain(v, what) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain(v, what) for v in value)
    if isinstance(value, list):
        return [_plain(v, what) for v in value]
    raise UnsupportedLeafError(f"DCP {what} holds a {type(value).__name__}; deltackpt stores only plain values")


def _portable(location: Any) -> Any:
    """What a Writer or Reader keeps and pickles: an absolute path, a URL, a Store or a Repo.  A
    relative path is anchored where the object was made, as a ``Repo`` is: a copy unpickled by a
    rank whose working folder differs must write into the same repository, not a new one beside it."""
    if isinstance(location, (str, os.PathLike)):
        return portable_location(location)
    return location


def _pickled(location: Any) -> Any:
    """A Repo travels as its location (path, URL or Store); the rest as :func:`_portable` keeps it."""
    return portable_location(location) if isinstance(location, Repo) else location


def _shard_name(fqn: str, offsets: "list[int] | None") -> str:
    return fqn if not offsets or not any(offsets) else f"{fqn}@{','.join(map(str, offsets))}"


class Writer(StorageWriter):
    """A DCP ``StorageWriter`` that commits one deltackpt version per ``dcp.save``.

    ``repo`` is a path, URL (``s3://...``), :class:`~deltackpt.store.Store` or
    :class:`~deltackpt.Repo`; ``step``, ``metrics``, ``tag`` and ``meta`` label the version as in
    :func:`deltackpt.save`.  The writer may be reused for the next save (set ``writer.step``).

    Example::

        writer = Writer("ckpt", step=0)
        for step in range(0, 1000, 100):
            writer.step = step
            dcp.save(state, storage_writer=writer)
    """

    def __init__(self, repo: "str | os.PathLike | Store | Repo", *, step: int | None = None,
                 metrics: dict | None = None, tag: str | None = None, meta: Any = None,
                 workers: int | None = None) -> None:
        self._location = _portable(repo)
        self.step, self.metrics, self.tag, self.meta = step, metrics, tag, meta
        self.workers = workers
        self.is_coordinator = False
        self.rank = 0
        #: version id committed by the last ``finish`` (coordinator only)
        self.version_id: str | None = None
        #: stats of this rank's last write_data (bytes written, chunks new/reused)
        self.last_stats: SaveStats | None = None
        # coordinator: the save lock held from the global plan until finish committed (a finalizer
        # releasing it; not picklable: None between saves)
        self._inflight: weakref.finalize | None = None
        self._handle: Repo | None = None   # opened for one save from a path, closed when it ends

    def _repo(self) -> Repo:
        if isinstance(self._location, Repo):
            return self._location
        if self._handle is None or self._handle.closed:
            self._handle = Repo(self._location, create=True)
        return self._handle

    def _close_handle(self) -> None:
        """End this rank's part of a save: close the handle it opened (nothing of it runs after)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def __getstate__(self) -> dict[str, Any]:
        # DCP sends storage objects to spawned ranks: the location travels, each rank reopens it
        # the in-flight save lock stays with the coordinator that took it (a finalizer does not pickle)
        return {**self.__dict__, "_location": _pickled(self._location), "_inflight": None, "_handle": None}

    # StorageWriter --------------------------------------------------------------------------
    def reset(self, checkpoint_id: "str | os.PathLike | None" = None) -> None:
        if checkpoint_id is not None:
            self._location = _portable(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._release_inflight()  # left by a save that failed before its finish
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank") or 0
        if is_coordinator:
            self._repo()  # the coordinator creates the repository before any rank writes to it

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Coordinator, before any rank writes: take a save lock held until ``finish`` committed.

        Each rank's ``write_data`` holds a save lock only while it writes; its chunks are then in
        the index but named by no manifest until ``finish``, and a gc in between would delete them
        (the version committed would not load).  This lock keeps gc out for the whole save, every
        rank's writes included; a failed save's lock goes with the next save or the writer."""
        self._release_inflight()
        self._inflight = weakref.finalize(self, internal.save_lease(self._repo()).release)
        return plans

    def _release_inflight(self) -> None:
        fin, self._inflight = self._inflight, None
        if fin is not None:
            fin()

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        repo = self._repo()
        inputs: list[BlobInput] = []
        kinds: list[tuple[str, list[int], bool]] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            name = _shard_name(item.index.fqn, list(item.index.offset) if item.index.offset is not None else None)
            if item.type == WriteItemType.BYTE_IO:
                raw = np.frombuffer(cast(io.BytesIO, data).getbuffer(), dtype=np.uint8)
                inputs.append(BlobInput(("dcp", name, "bytes"), raw, "uint8", 1, max(1, len(raw))))
                kinds.append(("uint8", [len(raw)], True))
                continue
            t = cast(torch.Tensor, data).detach()
            dtype = name_of(t.dtype, name)
            shape = list(t.shape)
            isz = t.element_size()
            row = isz * math.prod(shape[1:]) if shape and shape[0] else isz
            inputs.append(BlobInput(("dcp", name, dtype), byte_view(t), dtype, isz, max(row, isz)))
            kinds.append((dtype, shape, False))
        try:
            blobs, stats = internal.store_blobs(repo, inputs, workers=self.workers)
        finally:
            if not self.is_coordinator:
                self._close_handle()   # this rank's part of the save is done
        self.last_stats = stats
        results = [WriteResult(index=item.index, size_in_bytes=b.nbytes,
                               storage_data=_Stored(b, dtype, shape, is_bytes, 0))
                   for item, b, (dtype, shape, is_bytes) in zip(plan.items, blobs, kinds)]
        if results:  # this rank's share of the version's written bytes, summed by the coordinator
            results[0].storage_data.written_bytes = stats.objects_bytes
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator: one manifest for every rank's shards, then ``latest`` (the commit point)."""
        repo = self._repo()
        blobs: list[Blob] = []
        tensors: list[TensorEntry] = []
        storage: list[list] = []
        written = 0
        for rank_results in results:
            for wr in rank_results:
                st: _Stored = wr.storage_data
                written += st.written_bytes
                idx = wr.index
                offsets = list(idx.offset) if idx.offset is not None else None
                name = _shard_name(idx.fqn, offsets)
                blobs.append(st.blob)
                tensors.append(TensorEntry(name, ["dcp", name], st.dtype, st.shape, contiguous_strides(st.shape),
                                           len(blobs) - 1, 0))
                storage.append([idx.fqn, offsets, TensorRef(len(tensors) - 1)])
        tree = {DCP_TREE_KEY: {"layout": DCP_LAYOUT, "version": metadata.version,
                               "state_dict": _encode_sd_meta(metadata.state_dict_metadata),
                               "planner_data": _plain(metadata.planner_data, "planner_data"),
                               "storage": storage}}
        manifest = Manifest(parent=None, time=time.time(), tree=tree, tensors=tensors, blobs=blobs, step=self.step,
                            metrics=metrics_of(self.metrics), meta=self.meta,
                            extra={"written": {"bytes": written}, "dcp_world_size": len(results)})
        try:
            self.version_id = internal.commit_manifest(repo, manifest, tag=self.tag)
        finally:
            self._release_inflight()
            self._close_handle()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: "str | os.PathLike") -> bool:
        return False  # never picked automatically: pass storage_writer=Writer(repo)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self._location) if not isinstance(self._location, (Repo, Store))
                           else None)


def _encode_sd_meta(sd: dict) -> dict:
    out: dict[str, Any] = {}
    for fqn, md in sd.items():
        if isinstance(md, BytesStorageMetadata):
            out[fqn] = {"kind": "bytes"}
        elif isinstance(md, TensorStorageMetadata):
            p = md.properties
            out[fqn] = {"kind": "tensor", "dtype": name_of(p.dtype, fqn), "size": list(md.size),
                        "requires_grad": bool(p.requires_grad),
                        "chunks": [[list(c.offsets), list(c.sizes)] for c in md.chunks]}
        else:
            raise UnsupportedLeafError(f"DCP metadata of {fqn!r} is a {type(md).__name__}, which deltackpt cannot store")
    return out


def _decode_sd_meta(obj: Any, what: str) -> dict:
    if not isinstance(obj, dict):
        raise CorruptObjectError(f"{what}: DCP state_dict metadata is not a map")
    out: dict[str, Any] = {}
    for fqn, md in obj.items():
        if not isinstance(fqn, str) or not isinstance(md, dict) or md.get("kind") not in ("bytes", "tensor"):
            raise CorruptObjectError(f"{what}: DCP metadata entry {fqn!r} is malformed")
        if md["kind"] == "bytes":
            out[fqn] = BytesStorageMetadata()
            continue
        try:
            chunks = [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in md["chunks"]]
            props = TensorProperties(dtype=dtype_of(md["dtype"], fqn), requires_grad=bool(md["requires_grad"]))
            out[fqn] = TensorStorageMetadata(props, torch.Size(md["size"]), chunks)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptObjectError(f"{what}: DCP metadata of {fqn!r} is malformed ({exc})") from None
    return out


def _planner_data(value: Any) -> Any:
    """Paths in DCP's planner data are tuples; msgpack may hand lists back."""
    if isinstance(value, dict):
        return {k: tuple(v) if isinstance(v, list) else _planner_data(v) for k, v in value.items()}
    return value


class Reader(StorageReader):
    """A DCP ``StorageReader`` over one version of a deltackpt repository (``version`` is any
    revision: ``"latest"``, ``"latest~2"``, a tag, an id prefix).

    Example::

        state = {"model": model.state_dict()}
        dcp.load(state, storage_reader=Reader("ckpt", version="best"))
        model.load_state_dict(state["model"])
    """

    def __init__(self, repo: "str | os.PathLike | Store | Repo", *, version: str = "latest") -> None:
        self._location = _portable(repo)
        self.revision = version
        self.version_id: str | None = None
        self._manifest: Manifest | None = None
        self._where: dict[MetadataIndex, int] = {}
        self._handle: Repo | None = None   # opened for one load from a path, closed when it ends

    def _repo(self) -> Repo:
        if isinstance(self._location, Repo):
            return self._location
        if self._handle is None or self._handle.closed:
            self._handle = Repo(self._location)
        return self._handle

    def _close_handle(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def __getstate__(self) -> dict[str, Any]:
        # the manifest and index map are read again by the receiving process (read_metadata)
        return {**self.__dict__, "_location": _pickled(self._location), "_manifest": None, "_where": {},
                "_handle": None}

    def reset(self, checkpoint_id: "str | os.PathLike | None" = None) -> None:
        if checkpoint_id is not None:
            self._location = _portable(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        repo = self._repo()
        vid = internal.resolve_id(repo, self.revision)
        m = internal.manifest(repo, vid)
        tree = m.tree.get(DCP_TREE_KEY) if isinstance(m.tree, dict) else None
        what = f"version {vid[:10]}"
        if not isinstance(tree, dict) or tree.get("layout") != DCP_LAYOUT:
            raise StateMismatchError(f"{what} was not written by deltackpt.dcp.Writer; load it with deltackpt.load")
        where: dict[MetadataIndex, int] = {}
        for entry in tree.get("storage") or []:
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], TensorRef)
                    and 0 <= entry[2].index < len(m.tensors)):
                raise CorruptObjectError(f"{what}: DCP storage entry is malformed")
            fqn, offsets, ref = entry
            where[MetadataIndex(fqn, offsets)] = ref.index
        self.version_id, self._manifest, self._where = vid, m, where
        meta = Metadata(_decode_sd_meta(tree.get("state_dict"), what), planner_data=_planner_data(tree.get("planner_data")),
                        storage_data=where, storage_meta=StorageMeta(), version=tree.get("version"))
        return meta

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self._manifest is None:
            self.read_metadata()
        self._where = metadata.storage_data or self._where

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            self._read(plan, planner)
        finally:
            self._close_handle()   # this rank's part of the load is done
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        repo = self._repo()
        internal.refresh_index(repo)
        m = self._manifest
        assert m is not None
        for req in plan.items:
            i = self._where[req.storage_index]
            e = m.tensors[i]
            blob = m.blobs[e.blob]
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes(_read_range(repo, blob, 0, blob.nbytes))))
                continue
            dtype = dtype_of(e.dtype, e.name)
            src = _narrowed(repo, blob, e, dtype, list(req.storage_offsets), list(req.lengths))
            target = planner.resolve_tensor(req).detach()
            if list(target.shape) != list(src.shape):
                raise StateMismatchError(f"{e.name}: DCP asked for {list(target.shape)}, the shard slice is "
                                         f"{list(src.shape)}")
            target.copy_(src)
            planner.commit_tensor(req, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: "str | os.PathLike") -> bool:
        return False


def _read_range(repo: Repo, blob: Blob, start: int, end: int) -> np.ndarray:
    """Bytes ``[start, end)`` of a blob, reading only the chunks that overlap them."""
    out = np.empty(end - start, dtype=np.uint8)
    pos = 0
    for c in blob.chunks:
        lo, hi = pos, pos + c.raw_len
        pos = hi
        if hi <= start or lo >= end:
            continue
        data = np.frombuffer(internal.read_chunk(repo, c.chunk_id), dtype=np.uint8)
        if len(data) != c.raw_len:
            raise CorruptObjectError(f"chunk {c.chunk_id.hex()} has {len(data)} bytes, the manifest says {c.raw_len}")
        a, b = max(lo, start), min(hi, end)
        out[a - start:b - start] = data[a - lo:b - lo]
    return out


def _narrowed(repo: Repo, blob: Blob, e: TensorEntry, dtype: torch.dtype, offsets: list[int],
              lengths: list[int]) -> torch.Tensor:
    """The sub-block ``offsets``/``lengths`` of a saved shard, reading only the byte span from its
    first to its last element (a whole-rows slice, the usual resharding case, reads exactly its rows)."""
    shape = e.shape
    if not shape:
        return torch.from_numpy(_read_range(repo, blob, 0, blob.nbytes)).view(dtype).reshape(shape)
    isz = blob.itemsize
    strides = contiguous_strides(shape)
    if any(n == 0 for n in lengths):
        return torch.empty(lengths, dtype=dtype)
    first = sum(o * s for o, s in zip(offsets, strides))
    last = sum((o + n - 1) * s for o, n, s in zip(offsets, lengths, strides))
    raw = _read_range(repo, blob, first * isz, (last + 1) * isz)
    flat = torch.from_numpy(raw).view(dtype)
    # the span starts at element ``first``: index it as a strided view of the shard
    view = torch.as_strided(flat, lengths, strides, 0)
    return view
