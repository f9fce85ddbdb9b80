"""The last saved raw bytes of each chunk position, kept in memory so the next save can compute
deltas without reading the parent back from storage.  Bounded by bytes; when full, positions not
held are saved as keyframes (correct, only larger)."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkMemo:
    chunk_id: bytes      # id of the stored chunk (for lossy chunks: of the decoded bytes)
    data: bytes          # decoded bytes of that chunk: what a delta against it reproduces
    depth: int           # delta-chain depth of the stored object
    source_id: bytes     # hash of the bytes the user handed in (equal to chunk_id when lossless)


class DeltaCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: dict[tuple, ChunkMemo] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def get(self, key: tuple) -> ChunkMemo | None:
        return self._items.get(key)

    def put(self, key: tuple, memo: ChunkMemo) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old.data)
            if self._bytes + len(memo.data) <= self.max_bytes:
                self._items[key] = memo
                self._bytes += len(memo.data)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
