"""The write path: chunk, hash, dedup, encode, pack, then index, manifest and ref, in that order.

Nothing a reader can see changes until the ref moves: packs and the index only add chunks, and a
manifest is invisible until a ref (or a revision by id) names it.  Each file is written by the
store atomically and durably (temp, fsync, rename, directory fsync).
"""

from __future__ import annotations

import os
import time
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ..codecs.base import ChunkContext
from ..codecs.floats import max_abs_err
from ..codecs.pipeline import BaseChunk, encode_chunk
from ..codecs.registry import get as codec_of
from ..format import index as index_fmt
from ..format import refs
from ..format.ids import digest, hex_id
from ..format.manifest import Blob, ChunkRef, Manifest, TensorEntry
from ..format.objects import EncodedObject
from ..format.limits import PACK_MAX_OBJECTS, PACK_TARGET_BYTES
from ..format.pack import PackStream
from . import commit, locks
from .chunking import chunk_bounds
from .delta_cache import ChunkMemo
from .presence import ChunkPresence
from .layout import INDEX, pack_key
from .repository import Repository

WINDOW = 16  # chunks in flight per worker pool: bounds memory held by encoded results
ARENA_SEGMENT = 32 << 20  # copies kept by the delta cache are carved from buffers this large


@dataclass
class BlobInput:
    """Raw bytes to store as one blob, and how to match them with the parent's (``key``)."""

    key: tuple
    data: Any                 # bytes-like, contiguous, len == nbytes
    dtype: str
    itemsize: int
    row_bytes: int
    mode: str = "lossless"
    max_abs_err: float = 0.0  # filled in by the saver for lossy blobs
    exact: bool = True
    owner: Any = None
    """Set by a caller that lends ``data``: it promises the bytes stay unchanged until it calls
    ``repo.delta_cache.drop_owner(owner)``.  The delta cache then keeps views of them as the next
    save's delta bases instead of copying every chunk (a background save's staging copy)."""


@dataclass
class SaveStats:
    logical_bytes: int = 0
    chunks_total: int = 0
    chunks_new: int = 0
    chunks_reused: int = 0
    objects_bytes: int = 0
    packs: int = 0
    manifest_bytes: int = 0
    encodings: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    manifest: Manifest | None = None  # the manifest committed (write_version)

    @property
    def written_bytes(self) -> int:
        return self.objects_bytes + self.manifest_bytes


@dataclass
class _ChunkResult:
    cid: bytes
    raw_len: int
    parts: list | None       # object bytes (header, payload) when the chunk must be written
    encoding: int
    base: bytes | None
    depth: int
    err: float
    lossy: bool


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class _Packer:
    """Streams objects into pack files as they arrive (the write syscalls overlap the workers'
    encoding), then writes one index file for the packs of this save."""

    def __init__(self, repo: Repository, stats: SaveStats) -> None:
        self.repo = repo
        self.stats = stats
        self.stream: PackStream | None = None
        self.writer = None
        self.written: dict[str, tuple[int, list]] = {}
        self.pending: set[bytes] = set()

    def add(self, r: _ChunkResult) -> None:
        assert r.parts is not None
        if self.stream is None:
            self.writer = self.repo.store.writer(site="pack")
            self.stream = PackStream(self.writer.write)
        self.stream.add(r.cid, r.parts, encoding=r.encoding, raw_len=r.raw_len, base=r.base, depth=r.depth)
        self.pending.add(r.cid)
        if self.stream.size >= PACK_TARGET_BYTES or len(self.stream) >= PACK_MAX_OBJECTS:
            self.flush()

    def flush(self) -> None:
        if self.stream is None:
            return
        stream, writer = self.stream, self.writer
        self.stream = self.writer = None
        pid = stream.finish()
        writer.commit(pack_key(pid))
        self.written[pid] = (stream.size, list(stream.entries))
        self.stats.packs += 1
        self.stats.objects_bytes += stream.size

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
        self.stream = self.writer = None

    def finish(self) -> None:
        self.flush()
        if not self.written:
            return
        data = index_fmt.encode(self.written)
        key = INDEX + hex_id(data)
        self.repo.store.put_atomic(key, data, site="index")
        for pid, (_plen, entries) in self.written.items():
            self.repo.add_index_entries(pid, entries)
        self.repo.note_index_file(key)


class _CopyArena:
    """Where a save's private copies of its chunks go when the delta cache will keep them: slices
    of a few large numpy buffers instead of one fresh ``bytes`` per chunk.  Kept memory is fresh
    memory, and a fresh 2 MiB allocation costs 512 page faults; numpy backs buffers of 4 MiB and
    more with transparent huge pages, which makes the copy of a 100 MiB state ~3x cheaper.

    A buffer lives while any slice of it does, so only copies the cache will hold come from here
    (at most its size, in save order, which is the order the cache fills and is refilled by the
    next save); transient copies (cache off or full, lossy blobs) stay per-chunk ``bytes`` so the
    save's memory stays bounded by the cache plus the window.  At most about one segment more than
    the cache is held while a save replaces the previous save's copies."""

    def __init__(self, budget: int) -> None:
        self.left = budget     # bytes the cache can still take
        self.buf: np.ndarray | None = None
        self.pos = 0

    def take(self, n: int) -> np.ndarray | None:
        if n > self.left or n == 0:
            return None
        if self.buf is None or self.pos + n > len(self.buf):
            self.buf = np.empty(max(n, min(ARENA_SEGMENT, self.left)), dtype=np.uint8)
            self.pos = 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        self.left -= n
        return out


def _encode_one(repo: Repository, raw: memoryview | bytes, ctx: ChunkContext, memo: ChunkMemo | None, mode: str,
                known: Callable[[bytes], bool], present: ChunkPresence, copy_to: np.ndarray | None = None,
                owner: Any = None) -> tuple[_ChunkResult, ChunkMemo]:
    # the one copy (into ``copy_to``, or a fresh bytes): the caller's tensor may change once save()
    # returns, and the id must be the hash of exactly the bytes encoded.  Lent bytes (``owner``)
    # stay as they are until the owner is dropped from the cache: no copy.
    if owner is not None:
        data = raw
    elif copy_to is None:
        data = raw if isinstance(raw, bytes) else bytes(raw)
    else:
        np.copyto(copy_to, np.frombuffer(raw, dtype=np.uint8))
        data = memoryview(copy_to)
    src = digest(data)
    depth_of = lambda cid: getattr(present.entry(cid), "depth", 0)  # noqa: E731 - 0 when written by this save
    # lossless deltas against the position's last keyframe (a star) rather than the parent
    star = mode == "lossless" and repo.config.delta_base == "keyframe"
    if mode == "lossless":
        if known(src):
            r = _ChunkResult(src, len(data), None, 0, None, depth_of(src), 0.0, False)
            stored = ChunkMemo(src, data, r.depth, src, owner=owner)
            return r, _next_base(memo, stored, None) if star else stored
    elif memo is not None and memo.source_id == src and known(memo.chunk_id):
        # unchanged since the last lossy save: reuse what was stored (maybe the input itself), with its error
        err = max_abs_err(memo.data, data, ctx.dtype) if memo.chunk_id != src else 0.0
        return _ChunkResult(memo.chunk_id, len(data), None, 0, None, memo.depth, err, memo.chunk_id != src), memo
    base = None
    entry = present.entry(memo.chunk_id) if memo is not None else None  # never a base whose pack is gone
    if (memo is not None and entry is not None and len(memo.data) == len(data)
            and (not star or memo.age < repo.config.keyframe_interval)):
        base = BaseChunk(memo.chunk_id, memo.data, entry.depth, entry.length)
    prefer = memo.winner if memo is not None and base is not None else None
    choice = encode_chunk(data, ctx, mode=mode, base=base, keyframe_interval=repo.config.keyframe_interval,
                          prefer=prefer)
    recon = choice.encoded.recon
    cid = src if recon is None else digest(recon)
    kept = data if recon is None else recon
    lossy = cid != src  # a lossy codec whose output equals the input (fp16 of small ints) stored it exactly
    if known(cid):
        r = _ChunkResult(cid, len(data), None, 0, None, depth_of(cid), choice.encoded.max_abs_err, lossy)
        stored = ChunkMemo(cid, kept, r.depth, src, owner=owner if recon is None else None)
        return r, _next_base(memo, stored, None) if star else stored
    params = dict(choice.encoded.params)
    base_id = choice.base.chunk_id if choice.base else None
    if base_id is not None:
        params["base"] = base_id
    head = EncodedObject(choice.encoding, len(data), params, b"").head()
    r = _ChunkResult(cid, len(data), [head, choice.encoded.payload], choice.encoding, base_id, choice.depth,
                     choice.encoded.max_abs_err, lossy)
    winner = choice.encoding if choice.lossless and choice.base is not None else None
    stored = ChunkMemo(cid, kept, choice.depth, src, winner=winner, owner=owner if recon is None else None)
    return r, _next_base(memo, stored, base_id) if star else stored


def _next_base(memo: ChunkMemo | None, stored: ChunkMemo, base_id: bytes | None) -> ChunkMemo:
    """The base for the next lossless save at this position (a star around the last keyframe):
    a keyframe becomes the base; after a delta against the base, the base stays (one older); a
    stored delta (reused, or written against something else) becomes the base only when there is
    none.  Only with ``delta_base = "keyframe"``; lossy chunks always chain on their decoded parent."""
    if stored.depth == 0:
        return stored
    if memo is not None and base_id == memo.chunk_id:
        # the keyframe stays the base; the codec this delta won with is remembered all the same
        return replace(memo, age=memo.age + 1, winner=stored.winner)
    return stored if memo is None else memo


def write_version(repo: Repository, blobs: list[BlobInput], tensors: list[TensorEntry], tree: Any, *,
                  step: int | None = None, metrics: dict | None = None, meta: Any = None,
                  tag: str | None = None, extra: dict | None = None, workers: int | None = None,
                  progress: Callable[[int, int], None] | None = None) -> tuple[str, SaveStats]:
    """Store ``blobs``, then commit a manifest naming ``tensors`` and ``tree``; returns (version id, stats)."""
    t0 = time.perf_counter()
    if tag is not None:
        refs.check_name(tag)
    commit.check_storable(Manifest(parent=None, time=0.0, tree=tree, tensors=tensors, blobs=[], step=step,
                                   metrics=dict(metrics or {}), meta=meta, extra=dict(extra or {})))
    stats = SaveStats()
    with locks.save_lock(repo.store):
        manifest_blobs = _store_locked(repo, blobs, stats, workers, progress)
        for t in tensors:
            src = blobs[t.blob]
            t.exact, t.max_abs_err = src.exact, src.max_abs_err
            if not src.exact:  # the lossy mode names what stored it; a blob it left exact is "lossless"
                t.encoding = src.mode
        stats.seconds = time.perf_counter() - t0
        written = {"bytes": stats.objects_bytes, "chunks_new": stats.chunks_new,
                   "chunks_reused": stats.chunks_reused, "encodings": stats.encodings}
        vid = _commit(repo, Manifest(parent=None, time=time.time(), tree=tree, tensors=tensors,
                                     blobs=manifest_blobs, step=step, metrics=dict(metrics or {}), meta=meta,
                                     writer=commit.writer_name(), extra={**(extra or {}), "written": written}), stats, tag)
    stats.seconds = time.perf_counter() - t0
    return vid, stats


def store_blobs(repo: Repository, blobs: list[BlobInput], *, workers: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> tuple[list[Blob], SaveStats]:
    """Write the chunks of ``blobs`` (packs, then one index file) and commit nothing: the returned
    blobs become part of a version only when a manifest naming them is committed
    (:func:`commit_manifest`).  Used by writers whose commit happens elsewhere (one DCP rank of many).
    Until then the chunks are unreferenced and gc's grace period is what keeps them.

    Example::

        blobs, stats = store_blobs(repo, [BlobInput(("t", "w"), data, "float32", 4, 1024)])
    """
    t0 = time.perf_counter()
    stats = SaveStats()
    with locks.save_lock(repo.store):
        manifest_blobs = _store_locked(repo, blobs, stats, workers, progress)
    stats.seconds = time.perf_counter() - t0
    return manifest_blobs, stats


def commit_manifest(repo: Repository, manifest: Manifest, *, tag: str | None = None) -> str:
    """Commit a manifest whose blobs are already stored (manifest, then ``latest``, then the tag);
    its parent is set to whatever ``latest`` is under the refs lock.  Returns the version id."""
    if tag is not None:
        refs.check_name(tag)
    manifest.writer = manifest.writer or commit.writer_name()
    return _commit(repo, manifest, SaveStats(), tag)


def _store_locked(repo: Repository, blobs: list[BlobInput], stats: SaveStats, workers: int | None,
                  progress: Callable[[int, int], None] | None) -> list[Blob]:
    """Chunks -> packs -> one index file, under a save lock the caller holds.  A failure leaves
    no pack under a final name (the streaming writer is aborted)."""
    repo.refresh_index()
    packer = _Packer(repo, stats)
    present = ChunkPresence(repo)   # dedup only against chunks whose packs exist (presence.py)
    known = lambda cid: cid in packer.pending or present.usable(cid)  # noqa: E731
    manifest_blobs: list[Blob] = []
    try:
        _write_blobs(repo, blobs, packer, stats, manifest_blobs, known, present, workers, progress)
    except BaseException:
        packer.abort()
        raise
    packer.finish()
    if present.missing_packs:
        warnings.warn(f"{repo.location}: {len(present.missing_packs)} pack(s) the index names are missing "
                      f"({', '.join(sorted(present.missing_packs)[:3])}...); this save stored the chunks it needed "
                      "again, but older versions may be damaged: run `deltackpt verify`", RuntimeWarning, stacklevel=2)
    return manifest_blobs


def _write_blobs(repo: Repository, blobs: list[BlobInput], packer: _Packer, stats: SaveStats,
                 manifest_blobs: list[Blob], known, present: ChunkPresence, workers: int | None, progress) -> None:
    """Hash and encode every chunk of every blob in a pool, keeping up to WINDOW chunks in flight
    ACROSS blobs (a model is mostly tensors of one or two chunks: a window per blob would leave
    the pool idle), and pack the results in submission order, so packs are laid out the same way
    for the same input."""
    total = sum(len(b.data) for b in blobs)
    done = 0
    chunk_lists: list[list[ChunkRef]] = [[] for _ in blobs]
    remaining = [0] * len(blobs)
    submitted = [False] * len(blobs)
    finished = 0
    in_flight: deque = deque()  # (blob index, chunk index, future), oldest first

    def finish_ready() -> None:
        nonlocal finished, done
        while finished < len(blobs) and submitted[finished] and remaining[finished] == 0:
            b = blobs[finished]
            manifest_blobs.append(Blob(len(b.data), b.itemsize, b.row_bytes, chunk_lists[finished]))
            stats.logical_bytes += len(b.data)
            done += len(b.data)
            finished += 1
            if progress:
                progress(done, total)

    def consume_oldest() -> None:
        bi, ci, fut = in_flight.popleft()
        _take(fut.result(), blobs[bi], ci, chunk_lists[bi], packer, repo, stats, known)
        remaining[bi] -= 1
        finish_ready()

    # a star keeps a keyframe as the base for several saves: longer than a lender's promise
    lent = [b.owner if b.owner is not None and b.mode == "lossless" and repo.config.delta_base != "keyframe" else None
            for b in blobs]
    arena = _CopyArena(min(repo.delta_cache.max_bytes,
                           sum(len(b.data) for b, o in zip(blobs, lent)
                               if b.mode == "lossless" and o is None and not hasattr(b.data, "read_range"))))
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        for bi, b in enumerate(blobs):
            bounds = chunk_bounds(len(b.data), b.row_bytes, b.itemsize, repo.config.chunk_bytes)
            # a source with read_range (a GPU tensor staged through a host buffer) is read a chunk
            # at a time, so no host copy of the whole tensor ever exists
            staged = getattr(b.data, "read_range", None)
            view = None if staged else memoryview(b.data).cast("B") if not isinstance(b.data, memoryview) \
                else b.data.cast("B")
            ctx = ChunkContext(b.dtype, b.itemsize, b.row_bytes, repo.level)
            remaining[bi] = len(bounds)
            for i, (s, e) in enumerate(bounds):
                memo = repo.delta_cache.get((b.key, i))
                if staged:  # read_range returns a private copy already
                    raw, copy_to = staged(s, e), None
                else:
                    raw, copy_to = view[s:e], arena.take(e - s) if b.mode == "lossless" and lent[bi] is None else None
                in_flight.append((bi, i, pool.submit(_encode_one, repo, raw, ctx, memo, b.mode, known, present, copy_to,
                                                     lent[bi])))
                while len(in_flight) >= WINDOW:
                    consume_oldest()
            submitted[bi] = True
            finish_ready()
        while in_flight:
            consume_oldest()
    finish_ready()


def _take(result: tuple, b: BlobInput, i: int, chunks: list[ChunkRef], packer: _Packer, repo: Repository,
          stats: SaveStats, known: Callable[[bytes], bool]) -> None:
    """Record one encoded chunk (in order): its reference, the delta cache, and its object."""
    r, memo = result
    chunks.append(ChunkRef(r.cid, r.raw_len))
    repo.delta_cache.put((b.key, i), memo)
    stats.chunks_total += 1
    if r.lossy:
        b.exact = False
        b.max_abs_err = max(b.max_abs_err, r.err)
    if r.parts is None or known(r.cid):
        stats.chunks_reused += 1
        return
    stats.chunks_new += 1
    name = codec_of(r.encoding).name
    stats.encodings[name] = stats.encodings.get(name, 0) + 1
    packer.add(r)


def _commit(repo: Repository, manifest: Manifest, stats: SaveStats, tag: str | None) -> str:
    vid, stats.manifest_bytes = commit.commit(repo, manifest, tag)
    stats.manifest = manifest
    return vid
