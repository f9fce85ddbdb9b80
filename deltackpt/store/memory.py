"""A dict-backed store for tests and for scratch repositories."""

from __future__ import annotations

import threading
import time

from ..errors import ObjectNotFoundError
from .base import Store, check_key


class MemoryStore(Store):
    durable = False
    atomic_swap = True

    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        try:
            data = self._data[check_key(key)][0]
        except KeyError:
            raise ObjectNotFoundError(f"no object {key!r}") from None
        end = len(data) if length is None else start + length
        return data[start:end]

    def size(self, key: str) -> int:
        return len(self.get(key))

    def mtime(self, key: str) -> float:
        self.get(key)
        return self._data[key][1]

    def put_atomic(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> None:
        with self._lock:
            self._data[check_key(key)] = (bytes(data), time.time())

    def put_if_absent(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> bool:
        with self._lock:
            if check_key(key) in self._data:
                return False
            self._data[key] = (bytes(data), time.time())
            return True

    def swap(self, key: str, expected: bytes | None, data: bytes, *, site: str = "object") -> bool:
        with self._lock:
            current = self._data.get(check_key(key))
            if (None if current is None else current[0]) != expected:
                return False
            self._data[key] = (bytes(data), time.time())
            return True

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in list(self._data) if k.startswith(prefix))

    def delete(self, key: str, *, site: str = "delete") -> None:
        with self._lock:
            self._data.pop(check_key(key), None)
