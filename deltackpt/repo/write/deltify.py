"""Deltification: older versions' chunks re-stored, after the fact, as deltas against newer chunks.

A save writes each changed chunk once, in its cheapest durable form (head.py): whole, or a small
forward delta.  So every version is written as the newest one, and its changed chunks keep that
form once newer versions replace them.  As git does at repack time, this step turns them into
*reverse deltas* against the chunk at the same position in the next version (XOR is symmetric, an
integer difference changes sign, sparse rows keep the old rows), for the versions still in the
repository, and drops the packs the old copies leave redundant.  A version that retention removes
before this step reaches it never costs a delta write.

It works a *period* at a time: a keyframe and the forward deltas that decode through it at its
position, once a newer chunk there no longer does.  The whole period is re-stored in reverse, each
chunk against the next newer one, so a period of sparse row updates keeps about its deltas' bytes
(re-storing its keyframe alone would keep every forward delta and add one holding all the
period's rows); only when that is no smaller is the keyframe re-stored alone.

What it is worth (it pays back, or it is not done): a position whose last change was dense (the
save's hint, bases.py), or whose chunks are under 4 KiB (deltify_plan.MIN_POSITION_BYTES: too small
to pay for the read, decode and encode that measure them), is not even tried; a delta must save at
least ``session.payback`` x the bytes it writes (at most ``1 / (1 + payback)`` of what it replaces:
head.PAYBACK), and it is written only when every pack it frees ends at least half redundant
(supersede.py rewrites a pack at that fraction: each byte a rewrite copies then frees at least one);
the rest waits until more of its pack is redundant. What a run found not worth it is remembered in
the write session (:class:`~.session.WriteSession`), so the steps after each save do not encode it
again; so are the sizes of the deltas it measured, so that a conversion dropped because its pack
fell short is judged again from its size and encoded only once it is kept.

What it never touches: the ``lag`` newest versions (by default the newest alone, so a repository
keeps about format 2's bytes; a ``keep_last`` policy raises it to the versions it is about to drop),
and any chunk their chains need, so the newest version stays one keyframe plus a bounded cheap
delta per chunk.  A keyframe keeps its form when the delta would not be small enough or when chains
through it would grow past the keyframe interval (a *retained* keyframe, as in format 2).

When it runs: after each save commits, one bounded step in the thread that saved (saver.py), so it
never outlives the save; at the end of gc; and on request (``Repo.deltify``, ``deltackpt
deltify``).  A process that never runs it still has a correct repository, only a larger one.

Crash safety is supersede.py's order: new objects, then an index naming them, then (under the refs
lock) index files rewritten without the dropped packs, then the packs deleted.  It runs under a
save lock, so gc never runs meanwhile.
"""

from __future__ import annotations

import math
import time
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ...codecs.base import ChunkContext
from ...codecs.pipeline import BaseChunk, encode_chunk
from ...codecs.registry import get as codec_of
from ...errors import DeltackptError
from ...format.objects import EncodedObject
from .. import locks
from ..layout import DEFAULT_DELTIFY_LAG
from ..repository import Repository
from .session import WriteSession
from .head import DELTA_CODECS, KEEP_WHOLE_ABOVE
from .packer import Packer
from .deltify_memo import DeltifyMemo
from .deltify_plan import Candidate, PackLedger, group_periods, period_key, plan, worth_it
from .supersede import REWRITE_DEAD_FRACTION, drop_superseded

#: the newest versions left as saved (latest)
DEFAULT_LAG = DEFAULT_DELTIFY_LAG
#: replaced bytes after which the step after a save only finishes the packs it began
STEP_BYTES = 256 << 20
BATCH_BYTES = 128 << 20
#: rounds an unbounded run makes at most
MAX_ROUNDS = 4
#: the step after a save looks at the versions of this many keyframe periods after the newest
#: ones (step_window): a period turns candidate within one period of its last save, and then has
#: several steps to be re-stored; older ones wait for gc or an explicit run.  Looking at every
#: version made a step's cost grow with the history (an 8 MB state: 40 ms a step at 50 versions,
#: 540 ms at 300)
STEP_PERIODS = 4


def step_window(keyframe_interval: int) -> int:
    """The versions the step after a save looks at, past the newest ones it leaves alone."""
    return STEP_PERIODS * (keyframe_interval + 1)


@dataclass
class DeltifyReport:
    """What one deltify run did."""

    chunks: int = 0             # chunks re-stored as reverse deltas
    keyframe_bytes: int = 0     # the stored bytes of the copies they replace (keyframes, forward deltas)
    written_bytes: int = 0      # bytes written: new deltas, packs rewritten, index files
    freed_bytes: int = 0        # bytes deleted: packs dropped or replaced, index files replaced
    remaining: int = 0          # candidates left for a later run (bounded work)
    skipped: int = 0            # candidates left alone unmeasured: their position did not pay back lately
    seconds: float = 0.0
    encodings: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"chunks": self.chunks, "keyframe_bytes": self.keyframe_bytes, "written_bytes": self.written_bytes,
                "freed_bytes": self.freed_bytes, "remaining": self.remaining, "skipped": self.skipped, "seconds": round(self.seconds, 3),
                "encodings": self.encodings}


def deltify(session: WriteSession, *, lag: int = DEFAULT_LAG, max_bytes: int | None = None,
            stop: Callable[[], bool] | None = None, window: int | None = None) -> DeltifyReport:
    """Re-store the chunks of versions older than the ``lag`` newest as reverse deltas; past
    ``max_bytes`` of replaced copies (no bound when None) only the packs already begun are
    finished; ``stop()`` true ends the run early, at a safe point; ``window``: only the chunks of
    the ``window`` versions after the ``lag`` newest are looked at (None: every version).

    Example::

        report = deltify(session, lag=1)
        report.chunks, report.freed_bytes
    """
    with locks.save_lock(session.store):
        return deltify_locked(session, lag=lag, max_bytes=max_bytes, stop=stop, window=window)


def deltify_locked(session: WriteSession, *, lag: int = DEFAULT_LAG, max_bytes: int | None = None,
                   stop: Callable[[], bool] | None = None, window: int | None = None) -> DeltifyReport:
    """:func:`deltify` for a caller that already keeps gc out (a save lock, or gc's own lock)."""
    t0 = time.perf_counter()
    report = DeltifyReport()
    if not session.settings.reverse_deltas:
        return report  # forward chains and stars are already deltas; format 1 readers follow no reverse delta
    # Dropping packs can leave a rewritten one mostly redundant in turn: an unbounded run goes on
    # until a round re-stores nothing (bounded runs leave that to the next step).
    for _round in range(1 if max_bytes is not None else MAX_ROUNDS):
        before = report.chunks
        if not _round_locked(session, lag, max_bytes, stop, report, window) or report.chunks == before:
            break
    report.seconds = time.perf_counter() - t0
    return report


def _round_locked(session: WriteSession, lag: int, max_bytes: int | None, stop: Callable[[], bool] | None,
                  report: DeltifyReport, window: int | None = None) -> bool:
    """One pass of :func:`deltify_locked`, adding to ``report``; False when ``stop`` ended it."""
    repo = session.repo
    repo.index.refresh()
    undo = report.chunks, report.keyframe_bytes, dict(report.encodings)
    # the save's whole-chunk hint says a dense delta was above KEEP_WHOLE_ABOVE (the default
    # payback's) of the keyframe: skip those when no delta that large would be kept anyway
    memo = session.deltify_memo if isinstance(session.deltify_memo, DeltifyMemo) else DeltifyMemo()
    session.deltify_memo = memo
    candidates, head = plan(repo, max(1, lag), skip_dense=session.keep_whole_above <= KEEP_WHOLE_ABOVE,
                            positions=memo.positions, settled=memo.settled, window=window)
    res = repo.index.resolution
    ledger = PackLedger(repo, {res.best[c.chunk_id][0] for c in candidates if c.chunk_id in res.best})
    memo.keep_only(candidates, ledger.size)
    hopeful = memo.measured_unpaid(candidates, session.keep_whole_above)
    report.skipped += len(candidates) - len(hopeful)
    periods = group_periods(worth_it(repo, hopeful, ledger))
    stats = _PackCounts()
    packer = Packer(repo, stats)
    restored: dict[bytes, bytes] = {}                # chunk -> the base of its new copy
    overlay: dict[bytes, tuple[bytes, int]] = {}     # chunk -> (new base, new depth), decided this run
    batch: list[_Converted] = []

    period_packs: list[set[str]] = []
    last_use: dict[str, int] = {}   # pack -> the last period with a copy in it
    offered: dict[str, int] = {}    # pack -> stored bytes of the candidates' copies in it
    for i, period in enumerate(periods):
        packs = set()
        for c in period:
            if c.chunk_id in res.best:
                pid, e = res.best[c.chunk_id]
                packs.add(pid)
                last_use[pid] = i
                offered[pid] = offered.get(pid, 0) + e.length
        period_packs.append(packs)

    def state(pid: str) -> tuple[int, int]:
        return ledger.dead.get(pid, 0), offered.get(pid, 0)
    batch_packs: set[str] = set()
    held = {"new": 0, "old": 0}   # the batch's encoded bytes and the stored bytes they replace

    def commit(upto: int) -> None:
        kept, short = _settle_encoded(session, batch, ledger, overlay, memo)
        for pid in short:  # remembered only once no later period of this run could add to it
            if last_use.get(pid, -1) <= upto:
                memo.waiting[pid] = state(pid)
        for conv in kept:
            for r in conv.results:
                packer.add(r)
                restored[r.cid] = r.base
                name = codec_of(r.encoding).name
                report.encodings[name] = report.encodings.get(name, 0) + 1
            for pid, length in conv.replaced:
                ledger.dead[pid] = ledger.dead.get(pid, 0) + length
            report.chunks += len(conv.results)
            report.keyframe_bytes += conv.old_bytes
        batch.clear()
        batch_packs.clear()
        held["new"] = held["old"] = 0

    touched: set[str] = set()   # packs whose copies this run re-stores
    over = False                # max_bytes reached: only finish the packs already begun
    try:
        for i, period in enumerate(periods):
            if stop is not None and stop():
                packer.abort()  # asked to stop (the process is ending): leave everything as it was
                report.chunks, report.keyframe_bytes, report.encodings = undo
                report.remaining = len(periods)
                return False
            packs = period_packs[i]
            if batch and held["new"] >= BATCH_BYTES and not packs & batch_packs:
                commit(i - 1)  # a batch ends between packs: one split across two would be judged by half
            if period_key(period) in memo.too_large or any(memo.waiting.get(p) == state(p) for p in packs):
                continue  # found not worth it before, and nothing it depends on has changed since
            over = over or (max_bytes is not None and report.keyframe_bytes + held["old"] >= max_bytes)
            if over and not packs <= touched:
                report.remaining += 1  # a pack only partly re-stored frees nothing: finish begun ones only
                continue
            conv = _convert_period(session, period, overlay, memo)
            if conv is not None:
                batch.append(conv)
                held["new"] += conv.new_bytes
                held["old"] += conv.old_bytes
                touched.update(pid for pid, _length in conv.replaced)
                batch_packs.update(pid for pid, _length in conv.replaced)
        commit(len(periods))
    except BaseException:
        packer.abort()
        raise
    packer.finish()
    report.written_bytes += stats.objects_bytes + packer.index_bytes
    if restored:
        freed, written = drop_superseded(repo, restored, head)
        report.freed_bytes, report.written_bytes = report.freed_bytes + freed, report.written_bytes + written
    return True


def _chain(repo: Repository, cid: bytes, overlay: Mapping[bytes, tuple[bytes, int]]) -> tuple[list[bytes], bool]:
    """The chunks ``cid`` decodes through (itself first), this run's decisions included, and
    whether the chain ends in a keyframe (not in a loop or a chunk with no copy)."""
    out: list[bytes] = []
    cur: bytes | None = cid
    res = repo.index.resolution
    while cur is not None and cur not in out:
        out.append(cur)
        if cur in overlay:
            cur = overlay[cur][0]
        else:
            best = res.best.get(cur)
            if best is None:
                return out, False
            cur = best[1].base
    return out, cur is None


@dataclass
class _Converted:
    """One period (or its keyframe alone) re-stored, not yet packed."""

    results: list[_Result]
    replaced: list[tuple[str, int]]   # the copies read until now: (pack id, stored bytes)

    @property
    def old_bytes(self) -> int:
        return sum(length for _pid, length in self.replaced)

    @property
    def new_bytes(self) -> int:
        return sum(r.size for r in self.results)


def _settle_encoded(session: WriteSession, batch: list[_Converted], ledger: PackLedger,
                    overlay: dict[bytes, tuple[bytes, int]], memo: DeltifyMemo) -> tuple[list[_Converted], set[str]]:
    """:func:`_settle`, then the kept conversions' deltas known by size alone encoded; one whose
    chunk cannot be read or no longer yields a delta (damaged since) leaves the batch, which is
    settled again without it."""
    batch = list(batch)
    while True:
        kept, short = _settle(session, batch, ledger, overlay)
        failed = [conv for conv in kept if not all(r.parts is not None or _encoded_again(session, r, memo)
                                                    for r in conv.results)]
        if not failed:
            return kept, short
        for conv in failed:
            batch.remove(conv)
            for r in conv.results:
                overlay.pop(r.cid, None)


def _encoded_again(session: WriteSession, r: _Result, memo: DeltifyMemo) -> bool:
    if not _encode(session, r) or r.parts is None:
        memo.encoded.pop(_delta_key(r.cand, r.base), None)
        return False
    return True


def _settle(session: WriteSession, batch: list[_Converted], ledger: PackLedger,
            overlay: dict[bytes, tuple[bytes, int]]) -> tuple[list[_Converted], set[str]]:
    """The conversions of ``batch`` worth packing: those whose every replaced copy sits in a pack
    that will then be dropped or rewritten (``REWRITE_DEAD_FRACTION`` of it dead).  A delta written
    beside a copy that stays only makes the repository larger.  Dropping one conversion can leave
    another's pack short of the threshold, or its chains without a base it relied on: repeat until
    none changes.  The dropped ones' decisions leave ``overlay``.  Returns the conversions kept and
    the packs that fell short."""
    kept = list(batch)
    gone: set[bytes] = set()
    dropped_for: set[str] = set()   # the packs that fell short
    while True:
        dead = dict(ledger.dead)
        for conv in kept:
            for pid, length in conv.replaced:
                dead[pid] = dead.get(pid, 0) + length
        short = {pid for conv in kept for pid, _ in conv.replaced
                 if dead[pid] < REWRITE_DEAD_FRACTION * ledger.size.get(pid, 0)}
        bad = [conv for conv in kept if any(pid in short for pid, _ in conv.replaced)
               or (gone and not _still_bounded(session, conv, overlay))]
        if not bad:
            return kept, dropped_for
        dropped_for |= short
        for conv in bad:
            kept.remove(conv)
            for r in conv.results:
                gone.add(r.cid)
                overlay.pop(r.cid, None)


def _still_bounded(session: WriteSession, conv: _Converted, overlay: Mapping[bytes, tuple[bytes, int]]) -> bool:
    """Whether ``conv``'s chunks still decode through their new bases within depth K, with the
    run's decisions as they stand (a conversion it relied on may have been dropped since: the chunk
    keeps its old form, which may lead back through this one, or be a longer chain)."""
    repo, k = session.repo, session.settings.keyframe_interval
    for r in conv.results:
        chain, closed = _chain(repo, r.cid, overlay)
        if not closed or len(chain) - 1 + r.height > k:
            return False  # a loop (the old form of a chunk it relied on reads through it), or too deep
    return True


def _convert_period(session: WriteSession, period: list[Candidate], overlay: dict[bytes, tuple[bytes, int]],
                    memo: DeltifyMemo) -> _Converted | None:
    """Re-store a period as reverse deltas, each chunk against the next newer one (its keyframe
    against the chunk that was its first forward delta), when that is at most
    ``session.keep_whole_above`` x what the period stores now; else its keyframe alone against the nearest newer chunk that does
    not decode through it.  The decisions go into ``overlay``; nothing is written yet."""
    res = session.repo.index.resolution
    local: dict[bytes, tuple[bytes, int]] = {}
    inside = {c.chunk_id for c in period}
    conv = _Converted([], [])
    for cand in period if len(period) > 1 else ():
        best = res.best.get(cand.chunk_id)
        got = _reverse_one(session, cand, local, overlay, inside, memo) if best is not None else None
        if got is None or best is None:   # (got is None whenever best is)
            conv = _Converted([], [])
            break
        conv.results.append(got)
        conv.replaced.append((best[0], best[1].length))
        local[cand.chunk_id] = (got.base, got.depth)
    keep_if_above = session.keep_whole_above
    if not conv.results or conv.new_bytes > keep_if_above * conv.old_bytes:
        keyframe = period[-1]
        best = res.best.get(keyframe.chunk_id)
        if best is None or best[1].base is not None:
            return None
        conv = _Converted([], [(best[0], best[1].length)])
        got = _reverse_one(session, keyframe, {}, overlay, frozenset(), memo)
        if got is None:
            memo.note(period, math.inf)   # no delta smaller than the chunk itself
            return None
        conv.results.append(got)
        memo.note(period, conv.new_bytes / max(1, conv.old_bytes))
        if conv.new_bytes > keep_if_above * conv.old_bytes:
            memo.too_large.add(period_key(period))
            return None
    else:
        memo.note(period, conv.new_bytes / max(1, conv.old_bytes))
    for r in conv.results:
        overlay[r.cid] = (r.base, r.depth)
    return conv


def _reverse_one(session: WriteSession, cand: Candidate, local: dict[bytes, tuple[bytes, int]],
                 overlay: dict[bytes, tuple[bytes, int]], inside: frozenset[bytes] | set[bytes],
                 memo: DeltifyMemo) -> _Result | None:
    """``cand`` as a reverse delta against the nearest newer chunk at its position that does not
    decode through it (``local``: its period's decisions so far, ``overlay``: the run's), within
    depth K for it and for every chain outside ``inside`` (its period, re-stored with it) that
    reads through it; None when there is none or a chunk is damaged.  Where ``memo`` knows the
    delta's size, nothing is read or encoded: the result carries the size alone (:func:`_encode`)."""
    repo, k = session.repo, session.settings.keyframe_interval
    res = repo.index.resolution
    view = ChainMap(local, overlay)
    height = res.height_outside(cand.chunk_id, inside)
    for succ in cand.successors:
        if cand.chunk_id in _chain(repo, succ, view)[0]:
            continue  # a forward delta of this chunk: it cannot be this one's base
        depth = view[succ][1] if succ in view else res.depth.get(succ)
        if depth is None or height + depth + 1 > k:
            continue
        key = _delta_key(cand, succ)
        if key in memo.encoded:
            known = memo.encoded[key]
            if known is None:
                return None
            return _Result(cand.chunk_id, cand.raw_len, None, known[1], succ, depth + 1, height, cand, known[0])
        got = _Result(cand.chunk_id, cand.raw_len, None, 0, succ, depth + 1, height, cand)
        if not _encode(session, got):
            return None
        memo.encoded[key] = None if got.parts is None else (got.size, got.encoding)
        return got if got.parts is not None else None
    return None


def _delta_key(cand: Candidate, base: bytes) -> tuple:
    return cand.chunk_id, base, cand.dtype, cand.itemsize, cand.row_bytes


def _encode(session: WriteSession, r: _Result) -> bool:
    """Fill in ``r.parts`` (None when no delta is smaller than the chunk); False when a chunk
    cannot be read (damaged: verify names it; a chunk that keeps its copy is no loss)."""
    try:
        old = session.repo.chunks.read_chunk(r.cid)
        new = session.repo.chunks.read_chunk(r.base)
    except DeltackptError:
        return False
    r.parts, encoding = _reverse_delta(old, r.base, new, r.depth - 1, r.cand)
    if r.parts is not None:
        r.encoding, r.size = encoding, sum(len(p) for p in r.parts)
    return True


@dataclass
class _PackCounts:
    """What the packer counts (packer.PackCounts)."""

    packs: int = 0
    objects_bytes: int = 0


@dataclass
class _Result:
    """An object for the packer (the fields chunk_encoder.ChunkResult gives it).  ``parts`` is
    None while only its size is known (from the memo): it is encoded once its conversion is kept."""

    cid: bytes
    raw_len: int
    parts: list | None
    encoding: int
    base: bytes
    depth: int
    height: int   # the longest chain outside its period that reads through it
    cand: Candidate
    size: int = 0


def _reverse_delta(old: bytes | memoryview, base_id: bytes, base: bytes | memoryview, base_depth: int, cand: Candidate) -> tuple[list | None, int]:
    """The smallest lossless delta of ``old`` against ``base`` as object parts, or (None, 0)."""
    ctx = ChunkContext(cand.dtype, cand.itemsize, cand.row_bytes)
    choice = encode_chunk(bytes(old), ctx, base=BaseChunk(base_id, bytes(base), base_depth), candidates=DELTA_CODECS,
                          keyframe_interval=1 << 30)
    if choice.base is None:
        return None, 0
    params = dict(choice.encoded.params)
    params["base"] = base_id
    head = EncodedObject(choice.encoding, len(old), params, b"").head()
    return [head, choice.encoded.payload], choice.encoding

