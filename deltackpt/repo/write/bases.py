"""The previous version as the source of a save's delta bases, when the handle has none in memory.

A save stores a changed chunk as a small delta against the chunk at the same position in the
previous version when that is cheaper (head.py).  A handle that saved before keeps those bases in
its delta cache; a fresh one (``deltackpt.save(state, "ckpt")`` opens one per call), or a handle
whose cache is full, finds them here instead: the parent manifest names each position's chunk,
the index says how it is stored (the keyframe it decodes through and the deltas written since),
and the chunk's bytes are read and decoded only when a changed chunk actually needs them, in the
encoder thread that encodes it.

Which positions are worth reading: one whose last change was too large for a head delta (*dense*:
more than half its rows changed, as a full fine-tune's weights and moments do at every save; head.py
writes sparse-rows deltas only) would most likely be written whole again, so its bytes are
not read, but at about one save in ``head.REJUDGE_EVERY`` (by the chunk's id), when the position
is judged again: a change that was dense need not stay so (a handle that saved keeps a small
sample instead and judges every save).  A save records which positions were dense in its manifest
(``extra["dense_chunks"]``, a bitmap over the manifest's chunks in blob order, and
``extra["whole_chunks"]``, those whose keyframe will likely stay whole; spec §10), so the next
save, in whatever process, knows without reading them.  Readers never need it: a missing or
malformed bitmap only costs reads.

Example::

    bases = ParentBases.of(repo, repo.latest())
    memo = bases.memo(("t", "model", "w", "float32"), 0, 4096)   # metadata only; data read on demand
"""

from __future__ import annotations

from typing import Iterable

from ...format.limits import MAX_CHAIN_DEPTH
from ...format.manifest import Manifest
from ..delta_cache import ChunkMemo
from ..repository import Repository

#: the manifest ``extra`` keys of the position bitmaps: changes too dense for a delta, and of those
#: the ones so dense their keyframe will likely stay whole (head.stays_whole)
DENSE_KEY = "dense_chunks"
WHOLE_KEY = "whole_chunks"


def blob_keys(m: Manifest) -> dict[tuple, int]:
    """Each blob's key as a save's planner names it (``("t", *key, dtype)`` for a tensor's own
    blob, ``("s", *key)`` for a shared storage, ``(*key, dtype)`` for DCP's shards) -> blob index."""
    out: dict[tuple, int] = {}
    for e in m.tensors:
        if not 0 <= e.blob < len(m.blobs):
            continue
        key = tuple(e.key)
        for k in (("t",) + key + (e.dtype,), ("s",) + key, key + (e.dtype,)):
            out.setdefault(k, e.blob)
    return out


def dense_bits(m: Manifest, key: str = DENSE_KEY) -> set[int]:
    """The chunk positions (over all blobs, in order) the manifest's writer flagged under ``key``."""
    raw = m.extra.get(key) if isinstance(m.extra, dict) else None
    if not isinstance(raw, (bytes, bytearray)):
        return set()
    total = sum(len(b.chunks) for b in m.blobs)
    return {i for i in range(min(total, len(raw) * 8)) if raw[i >> 3] >> (i & 7) & 1}


def encode_dense(flags: Iterable[bool]) -> bytes:
    """The bitmap :func:`dense_bits` reads (bit i of byte i // 8, least significant first)."""
    flags = list(flags)
    out = bytearray((len(flags) + 7) // 8)
    for i, f in enumerate(flags):
        if f:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


class ParentBases:
    """Delta-base memos for the positions of one parent version (metadata only; see the module
    docstring)."""

    def __init__(self, repo: Repository, m: Manifest, star: int = 0) -> None:
        self.repo = repo
        self.manifest = m
        self.star = star   # delta_base "keyframe": the keyframe interval (the memo is the keyframe)
        self.blobs = m.blobs
        self.keys = blob_keys(m)
        self.first = []   # blob index -> its first chunk's position over all blobs
        pos = 0
        for b in m.blobs:
            self.first.append(pos)
            pos += len(b.chunks)
        self.dense = dense_bits(m)
        self.whole = dense_bits(m, WHOLE_KEY)

    @classmethod
    def of(cls, repo: Repository, vid: str | None, *, star: int = 0) -> "ParentBases | None":
        """The bases of version ``vid`` (None when there is no such version or it does not parse).
        ``star``: the keyframe interval of a ``delta_base = "keyframe"`` repository (0 otherwise)."""
        if vid is None:
            return None
        try:
            return cls(repo, repo.manifest(vid), star)
        except Exception:  # noqa: BLE001 - a damaged parent only means no delta bases: keyframes
            return None

    def memo(self, key: tuple, i: int, raw_len: int, lossless: bool = True) -> ChunkMemo | None:
        """The parent's chunk at position ``i`` of blob ``key`` as a memo without its bytes (None
        when the parent has no such chunk, of that length, in the index).  In a star, a lossless
        position's memo is its keyframe; a lossy one always chains on its decoded parent."""
        b = self.keys.get(key)
        if b is None or i >= len(self.blobs[b].chunks):
            return None
        ref = self.blobs[b].chunks[i]
        if ref.raw_len != raw_len:
            return None
        index = self.repo.index
        cid = ref.chunk_id
        if not index.has_chunk(cid):
            return None
        # the chain below it: forward deltas since the position's keyframe (the newest version is
        # never re-stored as reverse deltas), what head.py's budget counts
        chain_bytes, cur, depth = 0, cid, 0
        while True:
            _pid, e = index.entry(cur)
            if e.base is None:
                anchor = e.length
                break
            chain_bytes += e.length
            depth += 1
            if depth > MAX_CHAIN_DEPTH or not index.has_chunk(e.base):
                return None
            cur = e.base
        if self.star and lossless:
            return self._star_memo(key, i, cid, cur, raw_len)
        pos = self.first[b] + i
        # the parent's save judged every position it had a base for: what it did not flag dense
        # changed sparsely (a save that holds the memos knows the same); the first version's
        # positions were never judged (chunk_encoder.encode_head samples those first)
        dense = pos in self.dense
        return ChunkMemo(cid, None, depth, cid, anchor_bytes=anchor, chain_bytes=chain_bytes,
                         sparse=not dense and self.manifest.parent is not None,
                         dense=dense, lasting=pos in self.whole, raw_len=raw_len)

    def _star_memo(self, key: tuple, i: int, cid: bytes, keyframe: bytes, raw_len: int) -> ChunkMemo:
        """A star's base: the position's keyframe, and how many deltas were written against it
        here (``age``), counted back through the versions before the parent."""
        m: Manifest | None
        age, seen, m = 0, {cid}, self.manifest
        if cid != keyframe:
            age = 1
            for _ in range(self.star):
                try:
                    m = self.repo.manifest(m.parent) if m.parent else None
                except Exception:  # noqa: BLE001 - an older manifest gone or damaged: count what was seen
                    m = None
                if m is None:
                    break
                b = blob_keys(m).get(key)
                if b is None or i >= len(m.blobs[b].chunks):
                    break
                older = m.blobs[b].chunks[i].chunk_id
                if older == keyframe:
                    break
                if older not in seen:
                    seen.add(older)
                    age += 1
        return ChunkMemo(keyframe, None, 0, keyframe, age=age, raw_len=raw_len)
