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
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..codecs.base import ChunkContext
from ..errors import StoreError
from ..codecs.floats import max_abs_err
from ..codecs.pipeline import BaseChunk, encode_chunk
from ..codecs.registry import get as codec_of
from ..format import refs
from ..format.ids import digest
from ..format.manifest import Blob, ChunkRef, Manifest, TensorEntry
from ..format.objects import EncodedObject
from . import commit, locks, supersede
from .arena import CopyArena
from .chunking import chunk_bounds
from .delta_cache import ChunkMemo, next_star_base
from .packer import Packer
from .presence import ChunkPresence
from .repository import Repository
from .reverse import ReverseDeltas

WINDOW = 16  # chunks in flight per worker pool: bounds memory held by encoded results


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
    chunks_restored: int = 0   # previous head chunks re-stored as reverse deltas (format 2)
    restored_bytes: int = 0    # their objects' bytes: what the previous version costs from now on
    superseded_bytes: int = 0  # head keyframe bytes those made redundant and removed
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


@dataclass
class _Save:
    """One save's writers and dedup answers, shared by its encoder threads."""

    repo: Repository
    present: ChunkPresence      # dedup only against chunks whose packs exist (presence.py)
    packer: Packer             # keyframes and forward deltas; with reverse deltas, the head keyframes
    back: Packer | None = None  # reverse deltas of the previous head chunks (format 2, reverse.py)
    rev: ReverseDeltas | None = None

    def known(self, cid: bytes) -> bool:
        return cid in self.packer.pending or self.present.usable(cid)

    def whole(self, cid: bytes) -> bool:
        """Stored as a keyframe, by this save or in a pack that exists."""
        if cid in self.packer.pending:
            return True
        e = self.present.entry(cid)
        return e is not None and e.base is None

    def depth(self, cid: bytes, recorded: int) -> int:
        """The real chain length of an indexed chunk (recorded depths go stale in format 2)."""
        d = self.repo.chain_depth(cid)
        return recorded if d is None else d


def _encode_one(sv: _Save, raw: memoryview | bytes, ctx: ChunkContext, memo: ChunkMemo | None, mode: str,
                copy_to: np.ndarray | None = None, owner: Any = None) -> tuple[_ChunkResult, ChunkMemo, _ChunkResult | None]:
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
    repo, known, present = sv.repo, sv.known, sv.present
    if sv.rev is not None and mode == "lossless":
        return _encode_head(sv, data, src, ctx, memo, owner)
    depth_of = lambda cid: sv.depth(cid, getattr(present.entry(cid), "depth", 0))  # noqa: E731 - 0 when written by this save
    # lossless deltas against the position's last keyframe (a star) rather than the parent
    star = mode == "lossless" and repo.config.delta_base == "keyframe"
    if mode == "lossless":
        if known(src):
            r = _ChunkResult(src, len(data), None, 0, None, depth_of(src), 0.0, False)
            stored = ChunkMemo(src, data, r.depth, src, owner=owner)
            return r, next_star_base(memo, stored, None) if star else stored, None
    elif memo is not None and memo.source_id == src and known(memo.chunk_id):
        # unchanged since the last lossy save: reuse what was stored (maybe the input itself), with its error
        err = max_abs_err(memo.data, data, ctx.dtype) if memo.chunk_id != src else 0.0
        return _ChunkResult(memo.chunk_id, len(data), None, 0, None, memo.depth, err, memo.chunk_id != src), memo, None
    base = None
    entry = present.entry(memo.chunk_id) if memo is not None else None  # never a base whose pack is gone
    if (memo is not None and entry is not None and len(memo.data) == len(data)
            and (not star or memo.age < repo.config.keyframe_interval)):
        base = BaseChunk(memo.chunk_id, memo.data, sv.depth(memo.chunk_id, entry.depth), entry.length)
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
        return r, next_star_base(memo, stored, None) if star else stored, None
    params = dict(choice.encoded.params)
    base_id = choice.base.chunk_id if choice.base else None
    if base_id is not None:
        params["base"] = base_id
    head = EncodedObject(choice.encoding, len(data), params, b"").head()
    r = _ChunkResult(cid, len(data), [head, choice.encoded.payload], choice.encoding, base_id, choice.depth,
                     choice.encoded.max_abs_err, lossy)
    winner = choice.encoding if choice.lossless and choice.base is not None else None
    stored = ChunkMemo(cid, kept, choice.depth, src, winner=winner, owner=owner if recon is None else None)
    return r, next_star_base(memo, stored, base_id) if star else stored, None


def _encode_head(sv: _Save, data, src: bytes, ctx: ChunkContext, memo: ChunkMemo | None,
                 owner: Any) -> tuple[_ChunkResult, ChunkMemo, _ChunkResult | None]:
    """Format 2 (reverse.py): the new chunk as a keyframe unless one is stored already, and the
    position's previous chunk as a delta against it when that pays."""
    assert sv.rev is not None
    if sv.whole(src):
        r = _ChunkResult(src, len(data), None, 0, None, 0, 0.0, False)
    else:
        choice = encode_chunk(data, ctx)
        head = EncodedObject(choice.encoding, len(data), dict(choice.encoded.params), b"").head()
        r = _ChunkResult(src, len(data), [head, choice.encoded.payload], choice.encoding, None, 0, 0.0, False)
    back, winner = None, memo.winner if memo is not None else None
    if memo is not None and memo.chunk_id != src:
        enc = sv.rev.encode(memo, src, data, ctx, sv.present)
        if enc is not None:
            parts, winner = enc
            back = _ChunkResult(memo.chunk_id, len(memo.data), parts, winner, src, 1, 0.0, False)
    return r, ChunkMemo(src, data, 0, src, winner=winner, owner=owner), back


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
        manifest_blobs, sv = _store_locked(repo, blobs, stats, workers, progress, reverse=True)
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
        if sv.rev is not None and sv.rev.restored:
            # the previous head keyframes now have reverse deltas: drop the packs they make redundant
            try:
                stats.superseded_bytes = supersede.drop_superseded(
                    repo, sv.rev.restored, protected={c.chunk_id for b in manifest_blobs for c in b.chunks})
            except StoreError as exc:
                raise StoreError(exc.errno, f"{repo.location}: version {vid[:10]} is committed, but dropping the "
                                 f"keyframes it made redundant failed ({exc.strerror or exc}); they stay until the "
                                 "next save or gc") from None
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
        # no reverse deltas here: only a commit may drop the keyframes they replace, and the commit
        # happens elsewhere; these chunks chain forward on the parent (delta_base "parent")
        manifest_blobs, _sv = _store_locked(repo, blobs, stats, workers, progress, reverse=False)
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
                  progress: Callable[[int, int], None] | None, *, reverse: bool) -> tuple[list[Blob], _Save]:
    """Chunks -> packs -> one index file (two with reverse deltas: the head keyframes' packs are
    dropped as a whole later), under a save lock the caller holds.  A failure leaves no pack under a
    final name (the streaming writers are aborted)."""
    repo.refresh_index()
    present = ChunkPresence(repo)
    sv = _Save(repo, present, Packer(repo, stats))
    if reverse and repo.config.delta_base == "child" and repo.config.keyframe_interval > 0:
        sv.back, sv.rev = Packer(repo, stats), ReverseDeltas(repo.resolution, repo.config.keyframe_interval)
    manifest_blobs: list[Blob] = []
    try:
        _write_blobs(sv, blobs, stats, manifest_blobs, workers, progress)
    except BaseException:
        sv.packer.abort()
        if sv.back is not None:
            sv.back.abort()
        raise
    sv.packer.finish()
    if sv.back is not None:
        sv.back.finish()
    if present.missing_packs:
        warnings.warn(f"{repo.location}: {len(present.missing_packs)} pack(s) the index names are missing "
                      f"({', '.join(sorted(present.missing_packs)[:3])}...); this save stored the chunks it needed "
                      "again, but older versions may be damaged: run `deltackpt verify`", RuntimeWarning, stacklevel=2)
    return manifest_blobs, sv


def _write_blobs(sv: _Save, blobs: list[BlobInput], stats: SaveStats, manifest_blobs: list[Blob],
                 workers: int | None, progress) -> None:
    """Hash and encode every chunk of every blob in a pool, keeping up to WINDOW chunks in flight
    ACROSS blobs (a model is mostly tensors of one or two chunks: a window per blob would leave
    the pool idle), and pack the results in submission order, so packs are laid out the same way
    for the same input."""
    repo = sv.repo
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
        _take(fut.result(), blobs[bi], ci, chunk_lists[bi], sv, stats)
        remaining[bi] -= 1
        finish_ready()

    # a star keeps a keyframe as the base for several saves: longer than a lender's promise
    lent = [b.owner if b.owner is not None and b.mode == "lossless" and repo.config.delta_base != "keyframe" else None
            for b in blobs]
    arena = CopyArena(min(repo.delta_cache.max_bytes,
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
                in_flight.append((bi, i, pool.submit(_encode_one, sv, raw, ctx, memo, b.mode, copy_to, lent[bi])))
                while len(in_flight) >= WINDOW:
                    consume_oldest()
            submitted[bi] = True
            finish_ready()
        while in_flight:
            consume_oldest()
    finish_ready()


def _take(result: tuple, b: BlobInput, i: int, chunks: list[ChunkRef], sv: _Save, stats: SaveStats) -> None:
    """Record one encoded chunk (in order): its reference, the delta cache, and its objects."""
    r, memo, back = result
    chunks.append(ChunkRef(r.cid, r.raw_len))
    sv.repo.delta_cache.put((b.key, i), memo)
    if back is not None and sv.back is not None and sv.rev is not None and back.cid not in sv.back.pending:
        sv.back.add(back)
        sv.rev.restored.add(back.cid)
        stats.chunks_restored += 1
        stats.restored_bytes += sum(len(p) for p in back.parts)
        _count(stats, back.encoding)
    stats.chunks_total += 1
    if r.lossy:
        b.exact = False
        b.max_abs_err = max(b.max_abs_err, r.err)
    head = sv.rev is not None and b.mode == "lossless"
    if r.parts is None or (sv.whole(r.cid) if head else sv.known(r.cid)):
        stats.chunks_reused += 1
        return
    stats.chunks_new += 1
    _count(stats, r.encoding)
    sv.packer.add(r)


def _count(stats: SaveStats, encoding: int) -> None:
    name = codec_of(encoding).name
    stats.encodings[name] = stats.encodings.get(name, 0) + 1


def _commit(repo: Repository, manifest: Manifest, stats: SaveStats, tag: str | None) -> str:
    vid, stats.manifest_bytes = commit.commit(repo, manifest, tag)
    stats.manifest = manifest
    return vid
