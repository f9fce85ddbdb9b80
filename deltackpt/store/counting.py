"""A wrapper that counts requests and bytes, so tests can pin what a read touched."""

from __future__ import annotations

import threading
from typing import Sequence

from .base import MappedValue, Store, WrappingStore


class CountingStore(WrappingStore):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.gets = 0
        self.bytes_read = 0
        self.puts = 0
        self.bytes_written = 0
        self.keys_read: list[str] = []
        self.reads: list[tuple[str, int]] = []   # (key, bytes) per get, in order

    def bytes_read_under(self, prefix: str) -> int:
        """Bytes read from keys starting with ``prefix`` (``"packs/"``: chunk objects only)."""
        with self._lock:
            return sum(n for k, n in self.reads if k.startswith(prefix))

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        data = self.inner.get(key, start, length)
        self._count_read(key, len(data))
        return data

    def read_into(self, key: str, start: int, out: "memoryview | Sequence[memoryview]") -> int:
        n = self.inner.read_into(key, start, out)
        self._count_read(key, n)
        return n

    def map_value(self, key: str) -> MappedValue | None:
        mapped = self.inner.map_value(key)
        return None if mapped is None else _CountedMapping(self, key, mapped)

    def _count_read(self, key: str, n: int) -> None:
        with self._lock:
            self.gets += 1
            self.bytes_read += n
            self.keys_read.append(key)
            self.reads.append((key, n))

    def prefetch(self, key: str, start: int, length: int) -> None:
        self.inner.prefetch(key, start, length)  # a hint: no bytes reach the caller

    def put_atomic(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> None:
        self.inner.put_atomic(key, data, site=site, durable=durable)
        with self._lock:
            self.puts += 1
            self.bytes_written += len(data)

    def put_if_absent(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> bool:
        ok = self.inner.put_if_absent(key, data, site=site, durable=durable)
        with self._lock:
            self.puts += 1
            self.bytes_written += len(data) if ok else 0
        return ok

    def swap(self, key: str, expected: bytes | None, data: bytes, *, site: str = "object") -> bool:
        ok = self.inner.swap(key, expected, data, site=site)
        with self._lock:
            self.puts += 1
            self.bytes_written += len(data) if ok else 0
        return ok

    def describe(self) -> str:
        return f"counting({self.inner.describe()})"


class ReadMeter(CountingStore):
    """A CountingStore that describes itself as the store it wraps: a repository opened over it
    to measure a read (a rollback, a drill) names the real location in its errors."""

    def describe(self) -> str:
        return self.inner.describe()


class _CountedMapping:
    """A mapping whose views count as reads of the bytes they hold."""

    def __init__(self, store: CountingStore, key: str, inner: MappedValue) -> None:
        self._store, self._key, self._inner = store, key, inner

    def view(self, start: int, length: int, *, read_in: bool = True) -> memoryview | None:
        data = self._inner.view(start, length, read_in=read_in)
        if data is not None:
            self._store._count_read(self._key, len(data))
        return data

    def release(self, start: int, length: int) -> None:
        self._inner.release(start, length)

    def close(self) -> None:
        self._inner.close()
