"""The format-2 write topology (``delta_base = "child"``): the newest version of every chunk
position is stored whole, and the chunk it replaces becomes a delta against it.

Git stores the newest object whole and older ones as deltas against newer ones because recent
versions are read most.  Here that is the version ``resume`` reads after a crash: with forward
chains it sat at the end of the longest chain and decoded up to ``keyframe_interval + 1`` objects
per chunk.  Per changed position a save therefore writes two objects: the new chunk as a keyframe
(a *head* keyframe, in its own packs) and the previous chunk as a *reverse delta* whose base is
the new one (XOR is symmetric, an integer difference only changes sign, sparse rows keep the old
rows).  Once the version is committed, the previous head keyframe is redundant and its pack goes
(supersede.py), so the bytes kept per version are a delta, as with forward chains.

Chains stay bounded: re-storing a chunk as a delta lengthens every chain that ends in it by one,
so a chunk whose chain tree is already ``keyframe_interval - 1`` deep keeps its keyframe (a
*retained* keyframe), and older versions decode at most ``keyframe_interval`` links.

Only lossless chunks take part: lossy deltas chain on the decoded parent so that quantization
error never accumulates (pipeline.py), and they keep doing so here.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..codecs.base import ChunkContext
from ..codecs.pipeline import BaseChunk, encode_chunk
from ..format.objects import EncodedObject
from .copies import Resolution

if TYPE_CHECKING:
    from .delta_cache import ChunkMemo
    from .presence import ChunkPresence


class ReverseDeltas:
    """Per-save state of the reverse-delta writer, shared by the encoder threads.

    Example::

        rev = ReverseDeltas(repo.resolution, keyframe_interval=8)
        parts = rev.encode(memo, new_id, new_bytes, ctx, presence)   # None: keep the old keyframe
    """

    def __init__(self, resolution: Resolution, keyframe_interval: int) -> None:
        self.resolution = resolution
        self.k = keyframe_interval
        self._lock = threading.Lock()
        self._claimed: set[bytes] = set()
        self.restored: set[bytes] = set()   # chunks this save re-stored as deltas (after _take)

    def _claim(self, cid: bytes) -> bool:
        """One reverse delta per chunk per save, whichever position asks first (dedup: one
        chunk may sit at several positions that all changed)."""
        with self._lock:
            if cid in self._claimed:
                return False
            self._claimed.add(cid)
            return True

    def encode(self, memo: "ChunkMemo", new_id: bytes, new_data, ctx: ChunkContext,
               present: "ChunkPresence") -> "tuple[list, int] | None":
        """The reverse delta of ``memo`` (the position's previous chunk) against the new chunk, as
        (object parts, encoding), or None when the previous chunk keeps its keyframe: it is
        not one (already a delta, or its pack is gone), its chain tree is at the interval, or no
        delta beats its keyframe."""
        old = memo.chunk_id
        if self.k <= 0 or old == new_id or len(memo.data) != len(new_data):
            return None
        entry = present.entry(old)
        if entry is None or entry.base is not None:
            return None
        if self.resolution.height(old) + 1 > self.k:
            return None                     # a retained keyframe: bounds the chains behind it
        if not self._claim(old):
            return None
        choice = encode_chunk(memo.data, ctx, base=BaseChunk(new_id, new_data, 0, entry.length),
                              keyframe_interval=self.k, prefer=memo.winner)
        if choice.base is None:
            return None
        params = dict(choice.encoded.params)
        params["base"] = new_id
        head = EncodedObject(choice.encoding, len(memo.data), params, b"").head()
        if len(head) + len(choice.encoded.payload) >= entry.length:
            return None                     # no smaller than the keyframe it would replace
        return [head, choice.encoded.payload], choice.encoding
