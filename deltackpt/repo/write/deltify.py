"""Deltification: older versions' keyframes re-stored, after the fact, as deltas against newer chunks.

A save writes each changed chunk once, in its cheapest durable form (head.py): whole, or a small
forward delta.  So every version is written as the newest one, and its changed chunks keep their
keyframes once newer versions replace them.  As git does at repack time, this step turns those
keyframes into *reverse deltas* against the chunk at the same position in the next version (XOR is
symmetric, an integer difference changes sign, sparse rows keep the old rows), for the versions
still in the repository, and drops the packs the keyframes leave redundant.  A version that
retention removes before this step reaches it never costs a delta write.

What it never touches: the ``lag`` newest versions (a rollback of a step or two, and the versions a
``keep_last`` policy is about to drop), and any chunk their chains need, so the newest version stays
one keyframe plus a bounded cheap delta per chunk.  A keyframe keeps its form when no newer chunk at
its position can be its base (every one descends from it: a chain's anchor), when the delta would
not be smaller, or when chains through it would grow past the keyframe interval (a *retained*
keyframe, as in format 2).

When it runs: after saves, in the background at idle priority, a bounded step at a time
(background.py); at the end of gc; and on request (``Repo.deltify``, ``deltackpt deltify``).  A
process that never runs it still has a correct repository, only a larger one.

Crash safety is supersede.py's order: new objects, then an index naming them, then (under the refs
lock) index files rewritten without the dropped packs, then the packs deleted.  It runs under a
save lock, so gc never runs meanwhile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ...codecs.base import ChunkContext
from ...codecs.pipeline import BaseChunk, encode_chunk
from ...codecs.registry import get as codec_of
from ...errors import DeltackptError
from ...format.objects import EncodedObject
from .. import locks
from ..layout import DEFAULT_DELTIFY_LAG
from ..repository import Repository
from .head import DELTA_CODECS
from .packer import Packer
from .supersede import REWRITE_DEAD_FRACTION, drop_superseded

#: the newest versions left as saved (latest and the one before it)
DEFAULT_LAG = DEFAULT_DELTIFY_LAG
#: keyframe bytes one background step re-encodes at most (its memory: two chunks at a time)
STEP_BYTES = 256 << 20
#: a reverse delta replaces a keyframe only when at most this fraction of its size
KEEP_IF_ABOVE = 0.9


@dataclass
class DeltifyReport:
    """What one deltify run did."""

    chunks: int = 0             # keyframes re-stored as deltas
    keyframe_bytes: int = 0     # their keyframes' stored bytes
    written_bytes: int = 0      # bytes written: new deltas, packs rewritten, index files
    freed_bytes: int = 0        # bytes deleted: packs dropped or replaced, index files replaced
    remaining: int = 0          # candidates left for a later run (bounded work)
    seconds: float = 0.0
    encodings: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"chunks": self.chunks, "keyframe_bytes": self.keyframe_bytes, "written_bytes": self.written_bytes,
                "freed_bytes": self.freed_bytes, "remaining": self.remaining, "seconds": round(self.seconds, 3),
                "encodings": self.encodings}


@dataclass(frozen=True)
class _Candidate:
    chunk_id: bytes
    raw_len: int
    itemsize: int
    row_bytes: int
    dtype: str
    successors: tuple[bytes, ...]   # the chunks at its position in newer versions, nearest first


def deltify(repo: Repository, *, lag: int = DEFAULT_LAG, max_bytes: int | None = None,
            stop: Callable[[], bool] | None = None) -> DeltifyReport:
    """Re-store the keyframes of versions older than the ``lag`` newest as reverse deltas, at most
    ``max_bytes`` of keyframes (all when None); ``stop()`` true ends the run early, at a safe point.

    Example::

        report = deltify(repo, lag=2)
        report.chunks, report.freed_bytes
    """
    with locks.save_lock(repo.store):
        return deltify_locked(repo, lag=lag, max_bytes=max_bytes, stop=stop)


def deltify_locked(repo: Repository, *, lag: int = DEFAULT_LAG, max_bytes: int | None = None,
                   stop: Callable[[], bool] | None = None) -> DeltifyReport:
    """:func:`deltify` for a caller that already keeps gc out (a save lock, or gc's own lock)."""
    t0 = time.perf_counter()
    report = DeltifyReport()
    if repo.config.delta_base != "child" or repo.config.keyframe_interval <= 0:
        return report  # forward chains and stars are already deltas; format 1 readers follow no reverse delta
    repo.refresh_index()
    candidates, head = _plan(repo, max(1, lag))
    candidates = _worth_it(repo, candidates)
    stats = _PackCounts()
    packer = Packer(repo, stats)
    restored: set[bytes] = set()
    overlay: dict[bytes, tuple[bytes, int]] = {}   # chunk -> (new base, new depth), decided this run
    try:
        for i, cand in enumerate(candidates):
            if stop is not None and stop():
                packer.abort()  # asked to stop (the process is ending): leave everything as it was
                report.remaining = len(candidates)
                report.chunks = 0
                return report
            if max_bytes is not None and report.keyframe_bytes >= max_bytes:
                report.remaining = len(candidates) - i
                break
            if _convert(repo, cand, overlay, packer, report) is not None:
                restored.add(cand.chunk_id)
    except BaseException:
        packer.abort()
        raise
    packer.finish()
    report.written_bytes += stats.objects_bytes + packer.index_bytes
    if restored:
        freed, written = drop_superseded(repo, restored, head)
        report.freed_bytes, report.written_bytes = freed, report.written_bytes + written
    report.seconds = time.perf_counter() - t0
    return report


def _positions(repo: Repository, vid: str) -> dict[tuple, tuple[bytes, int, int, int, str]]:
    """A version's chunks by position (its blob's first tensor's key path, chunk index)."""
    m = repo.manifest(vid)
    owner: dict[int, tuple] = {}
    for t in m.tensors:
        owner.setdefault(t.blob, (tuple(t.key), t.dtype))
    out = {}
    for bi, blob in enumerate(m.blobs):
        if bi not in owner:
            continue
        key, dtype = owner[bi]
        for ci, c in enumerate(blob.chunks):
            out[(key, ci)] = (c.chunk_id, c.raw_len, blob.itemsize, blob.row_bytes, dtype)
    return out


def _plan(repo: Repository, lag: int) -> tuple[list[_Candidate], set[bytes]]:
    """Every chunk of the versions older than the ``lag`` newest that is a keyframe, with the chunks
    at its position in newer versions; and the chunks the newest versions' chains need (untouched)."""
    history = repo.history_order()  # newest first; past a removed ancestor, by time
    if len(history) <= lag:
        return [], set()
    by_version = [_positions(repo, v) for v in history]
    head_direct = {c[0] for pos in by_version[:lag] for c in pos.values()}
    head = repo.chunk_closure(c for c in head_direct if repo.has_chunk(c))
    res = repo.resolution
    seen: set[bytes] = set(head)
    out: list[_Candidate] = []
    for i in range(lag, len(by_version)):
        for key, (cid, raw_len, itemsize, row, dtype) in by_version[i].items():
            if cid in seen:
                continue
            seen.add(cid)
            if res.depth.get(cid) != 0 or not raw_len:
                continue  # a delta already (or unreadable: verify reports it, nothing to gain here)
            if any(e.base is not None for _pid, e in repo.entries_for(cid)):
                continue  # deltified before; its keyframe stays only inside a pack kept for others
            succ: list[bytes] = []
            for j in range(i - 1, -1, -1):
                nxt = by_version[j].get(key)
                if nxt is not None and nxt[0] != cid and nxt[1] == raw_len and nxt[0] not in succ:
                    succ.append(nxt[0])
            if succ:
                out.append(_Candidate(cid, raw_len, itemsize, row, dtype, tuple(succ)))
    return out, head


def _worth_it(repo: Repository, candidates: list[_Candidate]) -> list[_Candidate]:
    """The candidates whose keyframes' packs deltification would actually free: a pack holding
    them is dropped or rewritten only once enough of it is redundant (supersede.py's threshold),
    and a delta written for a keyframe that stays beside it makes the repository larger.  Those
    keyframes wait until more of their pack is superseded (or for gc)."""
    res = repo.resolution
    by_pack: dict[str, list[_Candidate]] = {}
    for cand in candidates:
        best = res.best.get(cand.chunk_id)
        if best is not None:
            by_pack.setdefault(best[0], []).append(cand)
    out: list[_Candidate] = []
    for pid, cands in by_pack.items():
        entries = repo.pack_entries.get(pid, [])
        total = sum(e.length for e in entries)
        going = {c.chunk_id for c in cands}
        dead = sum(e.length for e in entries if e.chunk_id in going or res.best.get(e.chunk_id, (None,))[0] != pid)
        if total and dead >= REWRITE_DEAD_FRACTION * total:
            out.extend(cands)
    order = {c.chunk_id: i for i, c in enumerate(candidates)}
    return sorted(out, key=lambda c: order[c.chunk_id])


def _chain(repo: Repository, cid: bytes, overlay: dict[bytes, tuple[bytes, int]]) -> list[bytes]:
    """The chunks ``cid`` decodes through (itself first), this run's decisions included."""
    out: list[bytes] = []
    cur: bytes | None = cid
    res = repo.resolution
    while cur is not None and cur not in out:
        out.append(cur)
        if cur in overlay:
            cur = overlay[cur][0]
        else:
            best = res.best.get(cur)
            cur = best[1].base if best is not None else None
    return out


def _convert(repo: Repository, cand: _Candidate, overlay: dict[bytes, tuple[bytes, int]],
             packer: Packer, report: DeltifyReport) -> bytes | None:
    """Re-store one keyframe as a reverse delta against the nearest newer chunk at its position that
    does not decode through it; returns that base, or None when the keyframe stays."""
    res = repo.resolution
    k = repo.config.keyframe_interval
    best = res.best.get(cand.chunk_id)
    if best is None or best[1].base is not None:
        return None
    kf_len = best[1].length
    height = res.height(cand.chunk_id)
    for succ in cand.successors:
        chain = _chain(repo, succ, overlay)
        if cand.chunk_id in chain:
            continue  # a forward delta of this keyframe: it cannot be this one's base
        depth = overlay[succ][1] if succ in overlay else res.depth.get(succ)
        if depth is None or height + depth + 1 > k:
            continue
        try:
            old = repo.read_chunk(cand.chunk_id)
            new = repo.read_chunk(succ)
        except DeltackptError:
            return None  # damaged: verify names it; a keyframe that stays is no loss
        parts, encoding = _reverse_delta(old, succ, new, depth, cand)
        if parts is None or sum(len(p) for p in parts) > KEEP_IF_ABOVE * kf_len:
            return None
        packer.add(_Result(cand.chunk_id, cand.raw_len, parts, encoding, succ, depth + 1))
        overlay[cand.chunk_id] = (succ, depth + 1)
        report.chunks += 1
        report.keyframe_bytes += kf_len
        name = codec_of(encoding).name
        report.encodings[name] = report.encodings.get(name, 0) + 1
        return succ
    return None


@dataclass
class _PackCounts:
    """What the packer counts (packer.PackCounts)."""

    packs: int = 0
    objects_bytes: int = 0


@dataclass
class _Result:
    """An object for the packer (the fields chunk_encoder.ChunkResult gives it)."""

    cid: bytes
    raw_len: int
    parts: list
    encoding: int
    base: bytes
    depth: int


def _reverse_delta(old, base_id: bytes, base, base_depth: int, cand: _Candidate) -> tuple[list | None, int]:
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

