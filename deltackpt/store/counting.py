"""A wrapper that counts requests and bytes, so tests can pin what a read touched."""

from __future__ import annotations

import threading

from .base import Store


class CountingStore(Store):
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.atomic_create = inner.atomic_create
        self.durable = inner.durable
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.gets = 0
        self.bytes_read = 0
        self.puts = 0
        self.bytes_written = 0
        self.keys_read: list[str] = []

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        data = self.inner.get(key, start, length)
        with self._lock:
            self.gets += 1
            self.bytes_read += len(data)
            self.keys_read.append(key)
        return data

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def mtime(self, key: str) -> float:
        return self.inner.mtime(key)

    def put_atomic(self, key: str, data: bytes, *, site: str = "object") -> None:
        self.inner.put_atomic(key, data, site=site)
        with self._lock:
            self.puts += 1
            self.bytes_written += len(data)

    def put_if_absent(self, key: str, data: bytes, *, site: str = "object") -> bool:
        ok = self.inner.put_if_absent(key, data, site=site)
        with self._lock:
            self.puts += 1
            self.bytes_written += len(data) if ok else 0
        return ok

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str, *, site: str = "delete") -> None:
        self.inner.delete(key, site=site)

    def describe(self) -> str:
        return f"counting({self.inner.describe()})"
