"""The write path: chunk, hash, dedup, encode, pack, then index, manifest and ref, in that order.

Nothing a reader can see changes until the ref moves: packs and the index only add chunks, and a
manifest is invisible until a ref (or a revision by id) names it.  Each file is written by the
store atomically and durably (temp, fsync, rename, directory fsync).
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ...codecs import scratch
from ...codecs.base import ChunkContext
from ...codecs.registry import get as codec_of
from ...errors import DeltackptError
from ...format import refs
from ...format.manifest import Blob, ChunkRef, Manifest, TensorEntry
from .. import locks
from ..repository import Repository
from . import abandon, commit
from .arena import CopyArena
from .bases import DENSE_KEY, WHOLE_KEY, ParentBases, encode_dense
from ..delta_cache import ChunkMemo
from .chunk_encoder import SaveContext, encode_one
from .chunking import chunk_bounds
from .consolidate import consolidate
from .deltify import STEP_BYTES, deltify, deltify_locked, step_window
from .encoder_pool import EncoderPool, encoder_threads
from .packer import Packer
from .presence import ChunkPresence
from .session import WriteSession

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
    private: bool = False
    """``data`` belongs to this save (a background save's staging copy): nothing else writes it
    meanwhile, so chunks are hashed and encoded where they lie instead of from a scratch copy."""


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
    bases_read: int = 0               # bytes of delta bases read back from the repository
    dense: list[bool] = field(default_factory=list)  # per chunk, in manifest order: its change was dense
    lasting: list[bool] = field(default_factory=list)  # and so dense its keyframe will likely stay whole

    @property
    def written_bytes(self) -> int:
        return self.objects_bytes + self.manifest_bytes


def write_version(session: WriteSession, blobs: list[BlobInput], tensors: list[TensorEntry], tree: Any, *,
                  step: int | None = None, metrics: dict | None = None, meta: Any = None,
                  tag: str | None = None, extra: dict | None = None, workers: int | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  latest: bool = True) -> tuple[str, SaveStats]:
    """Store ``blobs``, then commit a manifest naming ``tensors`` and ``tree``; returns (version id, stats).

    ``latest=False`` commits it off the training line (an import): ``latest`` does not move, the
    manifest has no parent and records ``extra["off_line"] = True``, and its chunks follow no head
    budget (they are not the training line's newest version).

    After the commit, older versions are re-stored as reverse deltas, a bounded step in this
    thread (:func:`_maintain`): when this returns, nothing of the save is running."""
    t0 = time.perf_counter()
    repo = session.repo
    if tag is not None:
        refs.check_name(tag)
    if not latest:
        extra = {**(extra or {}), "off_line": True}
    commit.check_storable(Manifest(parent=None, time=0.0, tree=tree, tensors=tensors, blobs=[], step=step,
                                   metrics=dict(metrics or {}), meta=meta, extra=dict(extra or {})))
    stats = SaveStats()
    repo.require_present()
    with locks.save_lock(repo.store) as lock:
        manifest_blobs, _sv = _store_locked(session, blobs, stats, workers, progress, head=latest, owner=lock)
        for t in tensors:
            src = blobs[t.blob]
            t.exact, t.max_abs_err = src.exact, src.max_abs_err
            if not src.exact:  # the lossy mode names what stored it; a blob it left exact is "lossless"
                t.encoding = src.mode
        stats.seconds = time.perf_counter() - t0
        written = {"bytes": stats.objects_bytes, "chunks_new": stats.chunks_new,
                   "chunks_reused": stats.chunks_reused, "encodings": stats.encodings}
        hints = {DENSE_KEY: encode_dense(stats.dense), WHOLE_KEY: encode_dense(stats.lasting)} \
            if any(stats.dense) else {}
        vid = _commit(repo, Manifest(parent=None, time=time.time(), tree=tree, tensors=tensors,
                                     blobs=manifest_blobs, step=step, metrics=dict(metrics or {}), meta=meta,
                                     writer=commit.writer_name(),
                                     extra={**(extra or {}), "written": written, **hints}), stats, tag,
                      move_latest=latest)
        if not latest:  # the delta bases of the training line's next save are not the import's bytes
            session.delta_cache.clear()
        _tidy_index(repo)
        _maintain(session, locked=True)   # under the save's own lock: one lock file and renewer, not two
    stats.seconds = time.perf_counter() - t0
    return vid, stats


def store_blobs(session: WriteSession, blobs: list[BlobInput], *, workers: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> tuple[list[Blob], SaveStats]:
    """Write the chunks of ``blobs`` (packs, then one index file) and commit nothing: the returned
    blobs become part of a version only when a manifest naming them is committed
    (:func:`commit_manifest`).  Used by writers whose commit happens elsewhere (one DCP rank of many).
    Until then the chunks are unreferenced and gc's grace period is what keeps them.

    Example::

        blobs, stats = store_blobs(session, [BlobInput(("t", "w"), data, "float32", 4, 1024)])
    """
    t0 = time.perf_counter()
    stats = SaveStats()
    repo = session.repo
    repo.require_present()
    with locks.save_lock(repo.store) as lock:
        # these chunks chain forward on the parent (delta_base "parent"): a commit elsewhere names
        # them, and head.py's bounds are the committing writer's
        manifest_blobs, _sv = _store_locked(session, blobs, stats, workers, progress, head=False, owner=lock)
    stats.seconds = time.perf_counter() - t0
    return manifest_blobs, stats


def commit_manifest(session: WriteSession, manifest: Manifest, *, tag: str | None = None) -> str:
    """Commit a manifest whose blobs are already stored (manifest, then ``latest``, then the tag);
    its parent is set to whatever ``latest`` is under the refs lock.  Returns the version id."""
    if tag is not None:
        refs.check_name(tag)
    manifest.writer = manifest.writer or commit.writer_name()
    session.repo.require_present()
    vid = _commit(session.repo, manifest, SaveStats(), tag)
    _maintain(session)
    return vid


def _maintain(session: WriteSession, *, locked: bool = False) -> None:
    """After a commit: re-store what it made older as reverse deltas, one bounded step
    (``STEP_BYTES`` of replaced copies), in the caller's thread, so that nothing of a save runs
    once it has returned.  ``locked``: the caller holds a save lock (else the step takes one).  A
    failure is left for the next save or gc: nothing is lost, the repository is only larger
    meanwhile."""
    try:
        if session.deltify and session.settings.reverse_deltas:
            step = deltify_locked if locked else deltify
            session.last_maintenance = step(session, lag=session.deltify_lag, max_bytes=STEP_BYTES,
                                            window=step_window(session.settings.keyframe_interval))
    except (DeltackptError, OSError) as exc:
        session.last_maintenance = exc
    finally:
        # the chunks this save and its deltification decoded (bases read back, periods measured)
        # served this save only: holding them would keep up to the cache's size in memory
        session.repo.chunks.decoded.clear()
        # so did this thread's codec buffers (about 9 MiB on MiniLM: 0.035x of its state kept
        # between saves); the next step allocates them again, a few ms of page faults
        scratch.release()


def _store_locked(session: WriteSession, blobs: list[BlobInput], stats: SaveStats, workers: int | None,
                  progress: Callable[[int, int], None] | None, *, head: bool,
                  owner: str | None = None) -> tuple[list[Blob], SaveContext]:
    """Chunks -> packs -> one index file, under the save lock ``owner`` the caller holds.  A failure
    before the packs are published leaves no pack under a final name (the packer deletes its own)."""
    repo = session.repo
    repo.index.refresh()
    if session.deltify and session.settings.reverse_deltas:
        # the step after the save needs every copy: built once here, not after a lookup per chunk
        repo.index.hold_every_copy()
    present = ChunkPresence(repo)
    sv = SaveContext(session, present, Packer(repo, stats, owner), head=head and session.settings.reverse_deltas)
    manifest_blobs: list[Blob] = []
    try:
        _write_blobs(sv, blobs, stats, manifest_blobs, workers, progress)
        sv.packer.finish()
    except BaseException:
        sv.packer.abort()
        raise
    if present.missing_packs:
        warnings.warn(f"{repo.location}: {len(present.missing_packs)} pack(s) the index names are missing "
                      f"({', '.join(sorted(present.missing_packs)[:3])}...); this save stored the chunks it needed "
                      "again, but older versions may be damaged: run `deltackpt verify`", RuntimeWarning, stacklevel=2)
    return manifest_blobs, sv


def _write_blobs(sv: SaveContext, blobs: list[BlobInput], stats: SaveStats, manifest_blobs: list[Blob],
                 workers: int | None, progress: Callable[[int, int], None] | None) -> None:
    """Hash and encode every chunk of every blob in a pool, keeping up to WINDOW chunks in flight
    ACROSS blobs (a model is mostly tensors of one or two chunks: a window per blob would leave
    the pool idle), and pack the results in submission order, so packs are laid out the same way
    for the same input."""
    session, settings = sv.session, sv.session.settings
    window = _Window(sv, blobs, stats, manifest_blobs, progress)
    # positions the handle holds no base for take the previous version's chunk (read on demand)
    parent = ParentBases.of(sv.repo, sv.repo.latest(),
                            star=settings.keyframe_interval if settings.delta_base == "keyframe" else 0)
    with EncoderPool(encoder_threads(window.total, workers)) as pool:
        for bi, b in enumerate(blobs):
            bounds = chunk_bounds(len(b.data), b.row_bytes, b.itemsize, settings.chunk_bytes)
            # a source with read_range (a GPU tensor staged through a host buffer) is read a chunk
            # at a time, so no host copy of the whole tensor ever exists
            staged = getattr(b.data, "read_range", None)
            view = None if staged else memoryview(b.data).cast("B") if not isinstance(b.data, memoryview) \
                else b.data.cast("B")
            ctx = ChunkContext(b.dtype, b.itemsize, b.row_bytes, settings.level)
            window.remaining[bi] = len(bounds)
            for i, (s, e) in enumerate(bounds):
                memo = session.delta_cache.get((b.key, i))
                if memo is None and parent is not None:
                    memo = parent.memo(b.key, i, e - s, lossless=b.mode == "lossless")
                if staged:  # read_range returns a private copy already
                    raw, copy_to = staged(s, e), None
                else:
                    assert view is not None
                    raw, copy_to = view[s:e], None if b.private else window.scratch.take(e - s)
                window.add(bi, i, pool.submit(encode_one, sv, raw, ctx, memo, b.mode, copy_to), copy_to)

            window.submitted[bi] = True
            window.finish_ready()
        while window.in_flight:
            window.consume_oldest()
    window.finish_ready()
    stats.bases_read += sv.bases_read


class _Window:
    """The chunks in flight across blobs, taken oldest first; a blob joins the manifest (and
    progress moves) once all its chunks are taken, in blob order."""

    def __init__(self, sv: SaveContext, blobs: list[BlobInput], stats: SaveStats, manifest_blobs: list[Blob],
                 progress: Callable[[int, int], None] | None) -> None:
        self.sv, self.blobs, self.stats, self.manifest_blobs, self.progress = sv, blobs, stats, manifest_blobs, progress
        self.total = sum(len(b.data) for b in blobs)
        sv.session.delta_cache.fit(self.total)
        self.done = 0
        self.chunk_lists: list[list[ChunkRef]] = [[] for _ in blobs]
        self.remaining = [0] * len(blobs)
        self.submitted = [False] * len(blobs)
        self.finished = 0
        self.in_flight: deque = deque()  # (blob index, chunk index, future, scratch), oldest first
        self.scratch = _Scratch()
        # the delta cache's copies of the chunks it keeps, carved from a few large buffers
        self.kept = CopyArena(sv.session.delta_cache.max_bytes)

    def add(self, bi: int, ci: int, fut: Future, scratch: Any = None) -> None:
        abandon.check()  # the process is exiting and told us not to finish: abort before the next chunk
        self.in_flight.append((bi, ci, fut, scratch))
        while len(self.in_flight) >= WINDOW:
            self.consume_oldest()

    def finish_ready(self) -> None:
        blobs = self.blobs
        while self.finished < len(blobs) and self.submitted[self.finished] and self.remaining[self.finished] == 0:
            b = blobs[self.finished]
            self.manifest_blobs.append(Blob(len(b.data), b.itemsize, b.row_bytes, self.chunk_lists[self.finished]))
            self.stats.logical_bytes += len(b.data)
            self.done += len(b.data)
            self.finished += 1
            if self.progress:
                self.progress(self.done, self.total)

    def consume_oldest(self) -> None:
        bi, ci, fut, scratch = self.in_flight.popleft()
        r, memo = fut.result()
        _take(r, self._kept(memo), self.blobs[bi], ci, self.chunk_lists[bi], self.sv, self.stats)
        if scratch is not None:
            self.scratch.give_back(scratch)
        self.remaining[bi] -= 1
        self.finish_ready()

    def _kept(self, memo: ChunkMemo) -> ChunkMemo:
        """What the delta cache keeps of a chunk's memo: its bytes only when the next save will
        want them (``sparse``), as a private copy (they may view the caller's tensor, a staging
        buffer or a scratch buffer, all reused once this save is done)."""
        if memo.data is None:
            return memo
        if not memo.sparse:
            return replace(memo, data=None, raw_len=memo.size)
        if isinstance(memo.data, bytes):
            return memo   # a GPU tensor's chunk staged to the host (read_range): already its own
        copy = self.kept.take(memo.size)
        if copy is None:
            return replace(memo, data=None, raw_len=memo.size)   # past the cache's budget
        np.copyto(copy, np.frombuffer(memo.data, dtype=np.uint8))
        return replace(memo, data=copy.data)


class _Scratch:
    """Scratch buffers for copies of chunks of a caller's live tensors, reused across the save's
    window (the same warm pages for every chunk, no fresh memory per chunk)."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []

    def take(self, n: int) -> np.ndarray:
        for i, buf in enumerate(self._free):
            if len(buf) >= n:
                return self._free.pop(i)[:n]
        return np.empty(n, dtype=np.uint8)

    def give_back(self, buf: np.ndarray) -> None:
        base = buf.base if isinstance(buf.base, np.ndarray) else buf
        if len(self._free) <= WINDOW:
            self._free.append(base)


def _take(r: Any, memo: ChunkMemo, b: BlobInput, i: int, chunks: list[ChunkRef], sv: SaveContext,
          stats: SaveStats) -> None:
    """Record one encoded chunk (in order): its reference, the delta cache, and its objects."""
    chunks.append(ChunkRef(r.cid, r.raw_len))
    sv.session.delta_cache.put((b.key, i), memo)
    stats.dense.append(bool(memo.dense))
    stats.lasting.append(bool(memo.dense and memo.lasting))
    stats.chunks_total += 1
    if r.lossy:
        b.exact = False
        b.max_abs_err = max(b.max_abs_err, r.err)
    # encode_one wrote parts only for a chunk it found unstored (or, for the newest version, stored
    # but not whole); another position of this save may have packed it since
    if r.parts is None or r.cid in sv.packer.pending:
        stats.chunks_reused += 1
        return
    stats.chunks_new += 1
    _count(stats, r.encoding)
    sv.packer.add(r)


def _tidy_index(repo: Repository) -> None:
    """Merge small index files once there are many (consolidate.py), so a new process opens the
    repository with a few reads.  The version is committed already: a failure here (a full disk)
    is left for the next save or gc, with a warning."""
    try:
        consolidate(repo)
    except (DeltackptError, OSError) as exc:
        warnings.warn(f"{repo.location}: merging index files failed ({exc}); the next save or gc tries again",
                      RuntimeWarning, stacklevel=3)


def _count(stats: SaveStats, encoding: int) -> None:
    name = codec_of(encoding).name
    stats.encodings[name] = stats.encodings.get(name, 0) + 1


def _commit(repo: Repository, manifest: Manifest, stats: SaveStats, tag: str | None, move_latest: bool = True) -> str:
    vid, stats.manifest_bytes = commit.commit(repo, manifest, tag, move_latest=move_latest)
    stats.manifest = manifest
    repo.remember_manifest(vid, manifest)
    return vid
