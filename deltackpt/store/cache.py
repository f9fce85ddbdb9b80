"""A local, size-bounded cache of byte ranges read from a remote store.

Packs, index files and manifests are named by the hash of their content and never change, so a
range read once can be served from local disk forever after (until evicted): rolling back to a
version whose chunks were already fetched costs no download.  Refs, locks and the config change
and are never cached.  Entries are written temp + rename, so several processes may share one
cache folder; a torn or missing entry is only a miss.

Example::

    cache = ReadCache("/tmp/dk-cache", max_bytes=1 << 30)
    store = CachedStore(FsspecStore("s3://bucket/run1", cache_dir=False), cache)
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from typing import Callable

from ..errors import LimitExceededError
from .base import Store, WrappingStore

#: key prefixes whose objects are immutable once written (content-addressed)
IMMUTABLE_PREFIXES = ("packs/", "index/", "manifests/")


def cacheable(key: str) -> bool:
    return key.startswith(IMMUTABLE_PREFIXES)


def check_bound(key: str, max_bytes: int, data: bytes) -> bytes:
    """``data`` when it is at most ``max_bytes`` long, else LimitExceededError naming ``key``."""
    if len(data) > max_bytes:
        raise LimitExceededError(f"{key!r} holds more than {max_bytes} bytes, the limit for it")
    return data


class ReadCache:
    """Byte ranges of immutable objects on local disk, least recently used evicted past ``max_bytes``.

    ``hits`` / ``misses`` / ``bytes_fetched`` / ``bytes_served`` count this process's traffic.
    """

    def __init__(self, directory: "str | os.PathLike", max_bytes: int = 2 << 30) -> None:
        self.dir = os.fspath(directory)
        self.max_bytes = max_bytes
        os.makedirs(self.dir, exist_ok=True)
        self._lock = threading.Lock()
        self._used: int | None = None
        self.hits = self.misses = self.bytes_fetched = self.bytes_served = 0

    @staticmethod
    def namespace(url: str) -> str:
        """A folder name for one repository URL (its hash: URLs hold '/' and ':')."""
        return hashlib.sha256(url.encode()).hexdigest()[:24]

    def _file(self, key: str, start: int, length: int | None) -> str:
        name = hashlib.sha256(f"{key}\0{start}\0{length}".encode()).hexdigest()
        return os.path.join(self.dir, name[:2], name)

    def get(self, key: str, start: int, length: int | None,
            fetch: Callable[[str, int, "int | None"], bytes]) -> bytes:
        """Bytes of ``key[start:start+length]``: from disk when cached, else ``fetch``-ed and kept."""
        path = self._file(key, start, length)
        for candidate, offset in ((path, 0), (self._file(key, 0, None), start)):
            data = self._read(candidate, offset, length)
            if data is not None:
                with self._lock:
                    self.hits += 1
                    self.bytes_served += len(data)
                return data
        data = fetch(key, start, length)
        with self._lock:
            self.misses += 1
            self.bytes_fetched += len(data)
        if len(data) <= self.max_bytes // 4 and (length is None or len(data) == length):
            self._write(path, data)
        return data

    def _read(self, path: str, offset: int, length: int | None) -> bytes | None:
        try:
            with open(path, "rb") as f:
                if offset:
                    f.seek(offset)
                data = f.read() if length is None else f.read(length)
            os.utime(path)  # recency for eviction
        except OSError:
            return None
        if length is not None and len(data) != length:
            return None  # a whole-object entry shorter than the asked range: not ours to answer
        return data

    def _write(self, path: str, data: bytes) -> None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{secrets.token_hex(4)}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            return  # a cache that cannot write is only a slower cache
        with self._lock:
            if self._used is None:
                self._used = self.used_bytes()
            else:
                self._used += len(data)
            over = self._used > self.max_bytes
        if over:
            self.evict()

    def used_bytes(self) -> int:
        total = 0
        for root, _dirs, files in os.walk(self.dir):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        return total

    def evict(self) -> None:
        """Drop least recently used entries until the cache holds at most 3/4 of ``max_bytes``."""
        entries = []
        for root, _dirs, files in os.walk(self.dir):
            for name in files:
                p = os.path.join(root, name)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                entries.append((st.st_mtime, st.st_size, p))
        entries.sort()
        used = sum(e[1] for e in entries)
        for _mtime, size, p in entries:
            if used <= self.max_bytes * 3 // 4:
                break
            try:
                os.unlink(p)
                used -= size
            except OSError:
                pass
        with self._lock:
            self._used = used

    def forget(self, key: str) -> None:
        """Drop the whole-object entry of a deleted key (ranged entries age out; their key's
        content could only come back identical, since names are content hashes)."""
        try:
            os.unlink(self._file(key, 0, None))
        except OSError:
            pass


class CachedStore(WrappingStore):
    """Any store with a :class:`ReadCache` in front of its reads of immutable keys."""

    def __init__(self, inner: Store, cache: ReadCache) -> None:
        super().__init__(inner)
        self.cache = cache

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if cacheable(key):
            return self.cache.get(key, start, length, self.inner.get)
        return self.inner.get(key, start, length)

    def get_bounded(self, key: str, max_bytes: int) -> bytes:
        if not cacheable(key):
            return self.inner.get_bounded(key, max_bytes)
        # kept as a whole-object entry (a ranged fetch of max_bytes + 1 never is); a cached entry
        # was fetched under some other caller's limit, so it is checked against this one
        data = self.cache.get(key, 0, None, lambda k, _s, _n: self.inner.get_bounded(k, max_bytes))
        return check_bound(key, max_bytes, data)

    def delete(self, key: str, *, site: str = "delete") -> None:
        self.inner.delete(key, site=site)
        if cacheable(key):
            self.cache.forget(key)
