"""What deltification can re-store (deltify.py): the *candidates* of the versions older than the
newest ``lag`` (chunks stored whole, or as forward deltas of the chunk before them at their
position), grouped into *periods* (a keyframe and the forward deltas read through it), with the
chunks at their position in newer versions that may serve as bases.  A cheap first filter drops
those whose packs would not end redundant enough even if every candidate in them went.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ...codecs.pipeline import SAMPLE_MIN
from ..repository import Repository
from .bases import DENSE_KEY, WHOLE_KEY, dense_bits
from .supersede import REWRITE_DEAD_FRACTION

#: forward deltas a period may hold (a writer keeps chains within K; this bounds a damaged repository)
MAX_PERIOD = 1024
#: positions whose chunks are smaller than this are never re-stored.  A reverse delta there saves
#: at most the chunk's few KiB per version, and measuring it costs a read, a decode and an encode:
#: ~0.5 ms of CPU a chunk, under 8 MB saved per CPU second where the save's own compression buys
#: ~500 (bench/MAINTENANCE.md, "Small positions").  It is also the size under which a save cannot
#: sample a change, so these positions never carry the save's hint that their change was dense:
#: a 4 MB CNN's 32 BatchNorm and bias chunks were measured at every step, for nothing.
MIN_POSITION_BYTES = SAMPLE_MIN


@dataclass(frozen=True)
class Candidate:
    """A chunk deltification may re-store as a reverse delta."""

    chunk_id: bytes
    raw_len: int
    itemsize: int
    row_bytes: int
    dtype: str
    successors: tuple[bytes, ...]   # the chunks at its position in newer versions, nearest first
    forward_of: bytes | None = None  # a forward delta: the older chunk at its position it is read through
    position: tuple | None = None    # (its blob's first tensor's key path, chunk index)


def _positions(repo: Repository, vid: str) -> tuple[dict[tuple, tuple[bytes, int, int, int, str]], set[tuple]]:
    """A version's chunks by position (its blob's first tensor's key path, chunk index), and the
    positions whose change its writer found so dense that no delta would shrink the keyframe it
    wrote (bases.py's ``whole_chunks`` hint; a writer older than that hint flagged them in
    ``dense_chunks``, which then meant the same: a writer now flags there every change no *sparse*
    delta takes, and small dense changes are worth a reverse delta later)."""
    m = repo.manifest(vid)
    owner: dict[int, tuple] = {}
    for t in m.tensors:
        owner.setdefault(t.blob, (tuple(t.key), t.dtype))
    hinted = isinstance(m.extra, dict) and WHOLE_KEY in m.extra
    dense_bits_ = dense_bits(m, WHOLE_KEY if hinted else DENSE_KEY)
    out, dense = {}, set()
    flat = 0
    for bi, blob in enumerate(m.blobs):
        for ci, c in enumerate(blob.chunks):
            if bi in owner:
                key, dtype = owner[bi]
                out[(key, ci)] = (c.chunk_id, c.raw_len, blob.itemsize, blob.row_bytes, dtype)
                if flat in dense_bits_:
                    dense.add((key, ci))
            flat += 1
    return out, dense


def plan(repo: Repository, lag: int, *, skip_dense: bool = True, positions: dict | None = None,
         settled: dict[bytes, str] | None = None, window: int | None = None) -> tuple[list[Candidate], set[bytes]]:
    """Every chunk of the versions older than the ``lag`` newest that is a keyframe or a forward
    delta of the chunk before it at its position, newest version first, with the chunks at its
    position in newer versions; and the chunks the newest versions' chains need (untouched).
    ``skip_dense``: leave out a chunk whose next change its writer found too dense for a delta
    (right when a rewrite must pay back at least as much as a forward delta's budget).
    ``positions``: each version's positions kept from earlier plans by version id (updated here;
    versions no longer in the history are dropped from it).  ``settled``: chunk -> the version
    whose copy of it earlier plans found followed by a dense change (never worth rewriting,
    whatever newer versions come), skipped without a look while that version is still the newest
    holding it (updated here; emptied when a version is gone, which changes what follows a chunk).
    ``window``: look only at the ``window`` versions after the ``lag`` newest (None: every one),
    so that the step after each save costs the same however long the history (the older ones
    had their turn while they were in the window; gc and an explicit run look at all of them);
    ``positions`` and ``settled`` then keep only what concerns those versions."""
    everything = repo.history_order()  # newest first; past a removed ancestor, by time
    history = everything if window is None else everything[:lag + window]
    known = {} if positions is None else positions
    final: dict[bytes, str] = {} if settled is None or not skip_dense else settled
    present = set(everything)
    for gone in set(known) - present:
        del known[gone]
        final.clear()
    if window is not None:
        looked_at = set(history)
        for old in set(known) - looked_at:
            del known[old]
        for cid in [c for c, v in final.items() if v not in looked_at]:
            del final[cid]
    if len(history) <= lag:
        return [], set()
    for v in history:
        if v not in known:
            known[v] = _positions(repo, v)
    by_version = [known[v][0] for v in history]
    dense_in = [known[v][1] for v in history]
    # a reverse delta's base is the nearest successor that does not decode through the candidate
    # and keeps chains within K: of the nearest 2K + 2, at least one is a keyframe not built on it
    # (a writer ends every chain within K), so looking further only costs a pass over all newer
    # versions per chunk, which made this plan quadratic in the history's length
    max_succ = 2 * repo.config.keyframe_interval + 2
    head_direct = {c[0] for pos in by_version[:lag] for c in pos.values()}
    head = repo.index.chunk_closure(c for c in head_direct if repo.index.has_chunk(c))
    res = repo.index.resolution
    seen: set[bytes] = set(head)
    out: list[Candidate] = []
    for i in range(lag, len(by_version)):
        for key, (cid, raw_len, itemsize, row, dtype) in by_version[i].items():
            if cid in seen or final.get(cid) == history[i]:
                continue
            seen.add(cid)
            if raw_len < MIN_POSITION_BYTES:
                continue  # too small to pay for measuring it (above)
            depth = res.depth.get(cid)
            if depth is None:
                continue  # unreadable: verify reports it, nothing to gain here
            succ: list[bytes] = []
            for j in range(i - 1, -1, -1):
                nxt = by_version[j].get(key)
                if nxt is not None and nxt[0] != cid and nxt[1] == raw_len and nxt[0] not in succ:
                    if not succ and skip_dense and key in dense_in[j]:
                        final[cid] = history[i]
                        break   # the change after it was too dense for a delta: never worth rewriting
                    succ.append(nxt[0])
                    if len(succ) >= max_succ:
                        break
            if not succ:
                continue   # nothing newer, or a change no delta shrinks enough
            bases = {e.base for _pid, e in repo.index.entries_for(cid)}
            if depth == 0:
                if bases - {None}:
                    continue  # deltified before; its keyframe stays only inside a pack kept for others
                out.append(Candidate(cid, raw_len, itemsize, row, dtype, tuple(succ), position=key))
                continue
            prev = by_version[i + 1].get(key) if i + 1 < len(by_version) else None
            if prev is None or bases != {prev[0]}:
                continue  # a reverse delta already, or a delta of some other chunk (a value that came back)
            out.append(Candidate(cid, raw_len, itemsize, row, dtype, tuple(succ), forward_of=prev[0], position=key))
    return out, head


class PackLedger:
    """Per pack: its stored bytes and how many of them no chunk reads (a copy of a chunk that
    reads another copy, or one this run has re-stored)."""

    def __init__(self, repo: Repository, packs: "Iterable[str] | None" = None) -> None:
        """Of ``packs`` (None: every pack): those holding the candidates are all a run looks at,
        and summing every pack's entries made each step cost as much as the whole index."""
        res = repo.index.resolution
        self.size: dict[str, int] = {}
        self.dead: dict[str, int] = {}
        every = repo.index.pack_entries
        for pid in every if packs is None else packs:
            entries = every.get(pid, ())
            self.size[pid] = sum(e.length for e in entries)
            self.dead[pid] = sum(e.length for e in entries if res.best.get(e.chunk_id, (None,))[0] != pid)


def worth_it(repo: Repository, candidates: list[Candidate], ledger: PackLedger) -> list[Candidate]:
    """The candidates whose keyframes' packs deltification would actually free: a pack holding
    them is dropped or rewritten only once enough of it is redundant (supersede.py's threshold),
    and a delta written for a keyframe that stays beside it makes the repository larger.  Those
    keyframes wait until more of their pack is superseded (or for gc)."""
    res = repo.index.resolution
    by_pack: dict[str, list[Candidate]] = {}
    for cand in candidates:
        best = res.best.get(cand.chunk_id)
        if best is not None:
            by_pack.setdefault(best[0], []).append(cand)
    out: list[Candidate] = []
    for pid, cands in by_pack.items():
        going = {c.chunk_id for c in cands}
        dead = ledger.dead.get(pid, 0) + sum(e.length for e in repo.index.pack_entries.get(pid, ())
                                             if e.chunk_id in going and res.best[e.chunk_id][0] == pid)
        total = ledger.size.get(pid, 0)
        if total and dead >= REWRITE_DEAD_FRACTION * total:
            out.extend(cands)
    order = {c.chunk_id: i for i, c in enumerate(candidates)}
    return sorted(out, key=lambda c: order[c.chunk_id])


def group_periods(candidates: list[Candidate]) -> list[list[Candidate]]:
    """The candidates as periods, newest period first: a keyframe and the forward deltas read
    through it at its position (each period newest chunk first, its keyframe last)."""
    order = {c.chunk_id: i for i, c in enumerate(candidates)}
    after: dict[bytes, Candidate] = {}
    for c in candidates:
        if c.forward_of is not None:
            after.setdefault(c.forward_of, c)  # a second forward delta of the same base stays as it is
    out: list[list[Candidate]] = []
    for c in candidates:
        if c.forward_of is not None:
            continue
        period = [c]
        while period[-1].chunk_id in after and len(period) <= MAX_PERIOD:
            period.append(after.pop(period[-1].chunk_id))
        out.append(period[::-1])
    return sorted(out, key=lambda p: order[p[0].chunk_id])


def period_key(period: list[Candidate]) -> tuple[bytes, ...]:
    return tuple(c.chunk_id for c in period)
