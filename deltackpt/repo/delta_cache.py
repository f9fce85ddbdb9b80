"""The base of the next delta at each chunk position, kept between saves by a handle's write session.

What a position keeps depends on what its next save will need (issue 32: memory that pays).  Every
position keeps a small *memo* (its chunk id, how it is stored, whether its last change was dense);
only a position whose last change was stored as a delta (``sparse``: an embedding table's rows, a
few changed elements) keeps its bytes, since its next change will most likely be a delta against
them too.  Bytes are bounded by ``max_bytes``: past it, or for every other position, the next save
reads the base back from the repository when it needs one (write/bases.py), which costs a decode
instead of memory.  A dense position (a full fine-tune's weights and moments) is written whole next
time and needs no base at all, only a 16 KiB sample to judge its next change on; a long chunk's
first keyframe keeps the next save's 64 KiB probe sample (write/head.py), and those give way first
when the bytes run short.

The memo is the last saved (for lossy chunks: decoded) version of the position, and the next save's
chunk may be a delta against it.  With ``"parent"`` every change is such a delta (a forward chain);
with ``delta_base = "child"`` (the default) only a change small next to the position's last keyframe
is (head.py decides; the memo carries that keyframe's size and what the chain since it cost).  With ``delta_base = "keyframe"`` in the config, lossless chunks form
a *star* instead: the memo is the position's last keyframe and every version until the next one is
a delta against it (``age`` counts them), so a read decodes at most two objects per chunk.  Lossy
chunks always chain on their decoded parent, so quantization error never accumulates."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ChunkMemo:
    chunk_id: bytes      # id of the stored chunk (for lossy chunks: of the decoded bytes)
    data: bytes | memoryview | None   # decoded bytes of that chunk (what a delta against it reproduces); None:
                         # not in memory, read from the repository when a delta needs it (bases.py)
    depth: int           # delta-chain depth of the stored object
    source_id: bytes     # hash of the bytes the user handed in (equal to chunk_id when lossless)
    age: int = 0         # star only: lossless deltas written against this chunk at this position so far
    winner: int | None = None  # the delta codec stored at this position last time (tried first next time)
    sparse: bool = False  # the last change here was stored as a delta: the next save wants these bytes
    anchor_bytes: int = 0  # "child": stored size of the position's last keyframe (0: unknown)
    chain_bytes: int = 0   # "child": stored bytes of the forward deltas written since that keyframe
    dense: bool = False    # "child": the last change here was too large for a delta (try a sample first)
    lasting: bool = False  # "child": the change was so dense its keyframe will likely stay whole (head.stays_whole)
    raw_len: int = 0       # the chunk's length when ``data`` is None
    sample: bytes | None = None  # "child", dense: the chunk's bytes at its probe slice (pipeline.probe_slice),
                           # so the next save judges the position again without reading the chunk back
    planes: tuple[int, ...] | None = None  # "child": the keyframe codec's choice for each byte plane of the
                           # position's last keyframe, taken by the next one without sampling (bytegroup.py)

    @property
    def size(self) -> int:
        """The chunk's length in bytes."""
        return len(self.data) if self.data is not None else self.raw_len

    @property
    def unjudged(self) -> bool:
        """It holds only the probe sample a first save kept of its chunk (head.FIRST_SAMPLE_MIN):
        no change at this position has been judged yet."""
        return self.sample is not None and self.data is None and not (self.dense or self.sparse)

    @property
    def held_bytes(self) -> int:
        """Memory this memo holds."""
        return (len(self.data) if self.data is not None else 0) + (len(self.sample) if self.sample is not None else 0)


class DeltaCache:
    """The memos of one handle, their bytes within ``max_bytes``: a fixed size, or (``None``)
    ``fraction`` of the state each save hands in (:meth:`fit`, at the start of a save)."""

    def __init__(self, max_bytes: int | None, fraction: float = 0.1) -> None:
        self.fixed, self.fraction = max_bytes, fraction
        self.max_bytes = max_bytes if max_bytes is not None else 0
        self._items: dict[tuple, ChunkMemo] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        # positions holding only the probe sample a first save kept (head.FIRST_SAMPLE_MIN), newest
        # last: the first to give way when a base or a dense sample would not fit otherwise
        self._first: dict[tuple, None] = {}

    def fit(self, state_bytes: int) -> None:
        """A save of ``state_bytes`` begins: the budget follows the state (unless fixed).  Bytes
        already held past a smaller budget are dropped as their positions are saved again."""
        if self.fixed is None:
            self.max_bytes = int(self.fraction * state_bytes)

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def get(self, key: tuple) -> ChunkMemo | None:
        return self._items.get(key)

    def put(self, key: tuple, memo: ChunkMemo) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._first.pop(key, None)
            if old is not None:
                self._bytes -= old.held_bytes
            if memo.held_bytes and self._bytes + memo.held_bytes > self.max_bytes:
                self._drop_first_samples(self._bytes + memo.held_bytes - self.max_bytes)
            if memo.held_bytes and self._bytes + memo.held_bytes > self.max_bytes:
                memo = replace(memo, data=None, raw_len=memo.size, sample=None)   # full: the base is read back if needed
            self._items[key] = memo
            self._bytes += memo.held_bytes
            if memo.unjudged:
                self._first[key] = None

    def _drop_first_samples(self, need: int) -> None:
        """Free at least ``need`` bytes from first saves' samples, newest first (their positions,
        later in the save under way, then read their chunk back to judge it, the same answer):
        what the cache keeps for the saves after this one then does not depend on them."""
        while need > 0 and self._first:
            key, _ = self._first.popitem()
            memo = self._items[key]
            assert memo.sample is not None
            self._items[key] = replace(memo, sample=None)
            self._bytes -= len(memo.sample)
            need -= len(memo.sample)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._first.clear()
            self._bytes = 0


def next_star_base(memo: ChunkMemo | None, stored: ChunkMemo, base_id: bytes | None) -> ChunkMemo:
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
