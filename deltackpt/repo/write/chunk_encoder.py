"""Encoding one chunk for a save: the copy of its bytes, dedup against what is stored, and the
choice of keyframe or delta against the position's previous chunk (``delta_base = "child"``: as
head.py decides).  Runs on the saver's encoder threads; the saver packs the results in order."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

import numpy as np

from ...codecs.base import ChunkContext
from ...codecs.floats import max_abs_err
from ...codecs.pipeline import PROBE_SAMPLE, SAMPLE_MIN, BaseChunk, encode_chunk, probe_slice, sample_delta_fraction
from ...errors import DeltackptError
from ...format.ids import digest
from ...format.objects import EncodedObject
from ..delta_cache import ChunkMemo, next_star_base
from ..repository import Repository
from .session import WriteSession
from .head import (FIRST_SAMPLE_MIN, REJUDGE_SAMPLE, HeadChoice, delta_budget, encode_changed, keyframe_choice, rejudge_due,
                   sample_fits, stays_whole)
from .packer import Packer
from .presence import ChunkPresence


@dataclass
class ChunkResult:
    cid: bytes
    raw_len: int
    parts: list | None       # object bytes (header, payload) when the chunk must be written
    encoding: int
    base: bytes | None
    depth: int
    err: float
    lossy: bool
    lasting: bool = False    # a keyframe likely to stay whole (head.stays_whole): packed apart


@dataclass
class SaveContext:
    """One save's writers and dedup answers, shared by its encoder threads."""

    session: WriteSession
    present: ChunkPresence      # dedup only against chunks whose packs exist (presence.py)
    packer: Packer             # the save's objects
    head: bool = False         # delta_base "child": lossless chunks follow head.py
    bases_read: int = 0        # bytes of delta bases read back from the repository (not kept in memory)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def repo(self) -> Repository:
        return self.session.repo

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
        d = self.repo.index.chain_depth(cid)
        return recorded if d is None else d

    def with_data(self, memo: ChunkMemo | None) -> ChunkMemo | None:
        """``memo`` with its bytes, read from the repository when the handle did not keep them
        (bases.py); None when they cannot be read (the chunk is then written whole)."""
        if memo is None or memo.data is not None:
            return memo
        if self.present.entry(memo.chunk_id) is None:
            return None   # its pack is gone (the save warns of it): never a base, written whole
        # decoded straight into a buffer of the memo's own: no decoded temporary per link of its
        # chain, and no copy of it (the reader's cached bytes are never handed out to be kept)
        buf = np.empty(memo.size, dtype=np.uint8)
        try:
            self.repo.chunks.read_chunk(memo.chunk_id, out=buf.data)
        except DeltackptError:
            return None
        with self._lock:   # encoder threads count it concurrently
            self.bases_read += memo.raw_len
        return replace(memo, data=buf.data)


def private_copy(raw: memoryview | bytes, into: np.ndarray) -> memoryview:
    """``raw`` (a caller's live tensor) copied into the scratch buffer ``into``: what is hashed and
    encoded then cannot change under the encoder."""
    np.copyto(into, np.frombuffer(raw, dtype=np.uint8))
    return into.data


def encode_one(sv: SaveContext, raw: memoryview | bytes, ctx: ChunkContext, memo: ChunkMemo | None, mode: str,
                copy_to: np.ndarray | None = None) -> tuple[ChunkResult, ChunkMemo]:
    """Hash and encode one chunk.  ``copy_to``: a scratch buffer the bytes are copied into first
    (the caller's live tensor: another thread may change it meanwhile, and the id must be the hash
    of exactly the bytes encoded); None when ``raw`` is the save's own (a staged copy).  The memo
    returned may view those bytes: the saver copies what the delta cache keeps."""
    if (copy_to is not None and sv.head and mode == "lossless" and memo is not None and not memo.dense
            and memo.size == len(raw) and (memo.data is not None or not memo.sparse)):
        # a position that did not change densely last time (a frozen layer's never does) is hashed
        # where it lies and copied only if it changed: an unchanged chunk is stored already, so no
        # bytes of it are encoded, and the memo keeps what it held
        if digest(raw) == memo.chunk_id and sv.known(memo.chunk_id):
            return ChunkResult(memo.chunk_id, len(raw), None, 0, None, memo.depth, 0.0, False), memo
    data = raw if copy_to is None else private_copy(raw, copy_to)
    src = digest(data)
    settings, known, present = sv.session.settings, sv.known, sv.present
    if sv.head and mode == "lossless":
        return encode_head(sv, data, src, ctx, memo)
    depth_of = lambda cid: sv.depth(cid, getattr(present.entry(cid), "depth", 0))  # noqa: E731 - 0 when written by this save
    # lossless deltas against the position's last keyframe (a star) rather than the parent
    star = mode == "lossless" and settings.delta_base == "keyframe"
    if mode == "lossless":
        if known(src):
            r = ChunkResult(src, len(data), None, 0, None, depth_of(src), 0.0, False)
            stored = ChunkMemo(src, data, r.depth, src, sparse=True)
            return r, next_star_base(memo, stored, None) if star else stored
    elif memo is not None and memo.data is not None and memo.source_id == src and known(memo.chunk_id):
        # unchanged since the last lossy save: reuse what was stored (maybe the input itself), with its error
        err = max_abs_err(memo.data, data, ctx.dtype) if memo.chunk_id != src else 0.0
        return ChunkResult(memo.chunk_id, len(data), None, 0, None, memo.depth, err, memo.chunk_id != src), memo
    base = None
    entry = present.entry(memo.chunk_id) if memo is not None else None  # never a base whose pack is gone
    if (memo is not None and entry is not None and memo.size == len(data)
            and (not star or memo.age < settings.keyframe_interval)):
        memo = sv.with_data(memo)
    if memo is not None and entry is not None and memo.data is not None and memo.size == len(data) \
            and (not star or memo.age < settings.keyframe_interval):
        base = BaseChunk(memo.chunk_id, memo.data, sv.depth(memo.chunk_id, entry.depth), entry.length)
    prefer = memo.winner if memo is not None and base is not None else None
    choice = encode_chunk(data, ctx, mode=mode, base=base, keyframe_interval=settings.keyframe_interval,
                          prefer=prefer)
    recon = choice.encoded.recon
    cid = src if recon is None else digest(recon)
    kept = data if recon is None else recon
    lossy = cid != src  # a lossy codec whose output equals the input (fp16 of small ints) stored it exactly
    if known(cid):
        r = ChunkResult(cid, len(data), None, 0, None, depth_of(cid), choice.encoded.max_abs_err, lossy)
        stored = ChunkMemo(cid, kept, r.depth, src, sparse=True)
        return r, next_star_base(memo, stored, None) if star else stored
    params = dict(choice.encoded.params)
    base_id = choice.base.chunk_id if choice.base else None
    if base_id is not None:
        params["base"] = base_id
    head = EncodedObject(choice.encoding, len(data), params, b"").head()
    r = ChunkResult(cid, len(data), [head, choice.encoded.payload], choice.encoding, base_id, choice.depth,
                     choice.encoded.max_abs_err, lossy)
    winner = choice.encoding if choice.lossless and choice.base is not None else None
    # forward chains and stars delta against their memo at every save: its bytes are always wanted
    stored = ChunkMemo(cid, kept, choice.depth, src, winner=winner, sparse=True)
    return r, next_star_base(memo, stored, base_id) if star else stored


def encode_head(sv: SaveContext, data: bytes | memoryview, src: bytes, ctx: ChunkContext,
                memo: ChunkMemo | None) -> tuple[ChunkResult, ChunkMemo]:

    """A lossless chunk of the newest version (``delta_base = "child"``, head.py): reused when it is
    stored whole (or unchanged at its position), else a forward delta when small next to the
    position's keyframe, else a keyframe.  The memo says whether the change was a delta
    (``sparse``: the next save wants these bytes) or dense (head.py: written whole next time
    without reading any base, unless the sample it keeps says the change turned sparse)."""
    unchanged = memo is not None and memo.chunk_id == src and memo.size == len(data)
    if memo is not None and unchanged and sv.known(src):
        r = ChunkResult(src, len(data), None, 0, None, memo.depth, 0.0, False)
        return r, replace(memo, data=data)
    if sv.whole(src):  # stored whole already (a value that came back, a tied copy): one object to read
        e = sv.present.entry(src)
        size = e.length if e is not None else 0
        return (ChunkResult(src, len(data), None, 0, None, 0, 0.0, False),
                ChunkMemo(src, data, 0, src, anchor_bytes=size))
    dense_before = memo is not None and memo.dense and memo.data is None
    # a long chunk's keyframe written where nothing was judged yet (the first save this handle
    # made of the position) kept a sample too (head.FIRST_SAMPLE_MIN): its first change is judged
    # on it, and a dense one is written whole without the previous version read back and decoded
    unjudged = memo is not None and memo.unjudged
    # a dense position is judged again on the sample this handle kept of it (no read) at every
    # save; the rest is measured again at about one save in REJUDGE_EVERY (head.rejudge_due), and
    # taken from the last keyframe otherwise: without a kept sample, whether the change is still
    # dense (reading the chunk back), the byte planes' compression (bytegroup.compress_planes_choosing)
    # and, once found, that a change this dense leaves the keyframe whole (head.stays_whole; not yet
    # found: measured at every save, bench/MAINTENANCE.md "Remembered plane choices" says why)
    remeasure = memo is None or rejudge_due(memo.chunk_id)
    rejudge = (dense_before or unjudged) and memo is not None and len(data) >= SAMPLE_MIN and (
        memo.sample is not None or remeasure)
    known_dense = dense_before and not rejudge
    if memo is not None and memo.planes is not None and not remeasure:
        ctx = ChunkContext(ctx.dtype, ctx.itemsize, ctx.row_bytes, ctx.level, memo.planes)
    carried = known_dense   # the position's "stays whole" flag is the last keyframe's
    overhead = 12 + 24  # object header and the base id in its parameters
    chosen: HeadChoice | None = None
    sampled = False
    if rejudge and memo is not None and memo.sample is not None:
        # a dense position's small sample, or the probe's own of a position not judged yet
        size = REJUDGE_SAMPLE if dense_before else PROBE_SAMPLE
        frac = sample_delta_fraction(data, ctx, None, base_sample=memo.sample, size=size, sparse=True)
        if not sample_fits(frac, len(data), delta_budget(memo.anchor_bytes, memo.chain_bytes), overhead):
            # still dense: nothing read (the dense delta's sample, when taken, says whether the
            # keyframe stays whole)
            dense_frac = sample_delta_fraction(data, ctx, None, base_sample=memo.sample,
                                               size=size) if remeasure or not memo.lasting else None
            carried = dense_frac is None
            chosen = keyframe_choice(data, ctx, frac, dense_frac, overhead)
        sampled = True
    if chosen is None:
        if not known_dense:   # a dense position's bytes are not worth reading back: it is written whole
            memo = sv.with_data(memo)
        base, budget = _head_base(sv, memo, len(data))
        # a sample first where the last change was dense, or was never judged (the repository's second
        # version) in a chunk large enough to sample: a dense change then costs one keyframe encode,
        # not a full delta encode thrown away as well
        probe = memo is not None and not sampled and (memo.dense or (not memo.sparse and len(data) >= SAMPLE_MIN))
        chosen = encode_changed(data, ctx, base, budget, prefer=memo.winner if memo is not None else None,
                                probe=probe, overhead=overhead)
    choice = chosen.encoding
    params = dict(choice.encoded.params)
    base_id = choice.base.chunk_id if choice.base is not None else None
    if base_id is not None:
        params["base"] = base_id
    head = EncodedObject(choice.encoding, len(data), params, b"").head()
    size = len(head) + len(choice.encoded.payload)
    lasting = base_id is None and (stays_whole(chosen.delta_fraction, len(data), size, sv.session.keep_whole_above)
                                   or (carried and memo is not None and memo.lasting))
    # dense: a sparse delta would not fit even a fresh chain's budget (not merely this chain's, spent)
    dense = known_dense if chosen.dense is None else chosen.dense
    r = ChunkResult(src, len(data), [head, choice.encoded.payload], choice.encoding, base_id, choice.depth, 0.0, False,
                    lasting)
    if base_id is not None:
        assert memo is not None
        return r, ChunkMemo(src, data, choice.depth, src, winner=choice.encoding, sparse=True,
                            anchor_bytes=memo.anchor_bytes, chain_bytes=memo.chain_bytes + size, planes=memo.planes)
    first = memo is None and len(data) >= FIRST_SAMPLE_MIN
    probe_at = probe_slice(len(data), ctx, REJUDGE_SAMPLE if dense else PROBE_SAMPLE) if dense or first else None
    return r, ChunkMemo(src, data, 0, src, anchor_bytes=size, dense=dense, lasting=lasting,
                        winner=memo.winner if memo is not None else None, sparse=not dense and memo is not None,
                        sample=bytes(data[probe_at]) if probe_at is not None else None,
                        planes=choice.encoded.planes)


def _head_base(sv: SaveContext, memo: ChunkMemo | None, n: int) -> tuple[BaseChunk | None, int]:
    """The position's previous chunk as a forward delta's base, and the stored bytes the delta may
    take (head.py's budget); (None, 0) when a keyframe must be written."""
    if memo is None or memo.data is None or len(memo.data) != n or memo.anchor_bytes <= 0:
        return None, 0
    entry = sv.present.entry(memo.chunk_id)  # never a base whose pack is gone
    if entry is None:
        return None, 0
    depth = sv.depth(memo.chunk_id, entry.depth)
    if depth + 1 > sv.session.settings.keyframe_interval:
        return None, 0
    return BaseChunk(memo.chunk_id, memo.data, depth, entry.length), delta_budget(memo.anchor_bytes, memo.chain_bytes)
