"""The Store interface every backend implements (tests/store/test_conformance.py checks each)."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from ..errors import LimitExceededError, StoreError

if TYPE_CHECKING:
    from .staged_write import StagePool

_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")


def check_key(key: str) -> str:
    """Keys are relative '/'-joined names of [A-Za-z0-9._-], no empty, '.' or '..' parts."""
    if not isinstance(key, str) or not _KEY.fullmatch(key) or any(p in (".", "..") or ".." in p for p in key.split("/")):
        raise StoreError(f"invalid store key {key!r:.100}")
    return key


class MappedValue(Protocol):
    """A stored value mapped into memory for one read (:meth:`Store.map_value`)."""

    def view(self, start: int, length: int, *, read_in: bool = True) -> memoryview | None:
        """Bytes ``[start, start + length)`` of the value (fewer at its end), read-only, where the
        store can lend them in place: those it holds in memory, and with ``read_in`` those it
        fetches first (into memory the caller then holds until :meth:`release`).  None when the
        caller should read them with ``read_into``, which reports any error."""

    def release(self, start: int, length: int) -> None:
        """The caller is done with ``[start, start + length)``: the store may drop those bytes
        from the process's memory (views of them stay valid)."""

    def close(self) -> None:
        """Let the mapping go (views still held keep their bytes until they are released)."""


class AtomicWriter:
    """Streams a value whose key is known only at the end (packs are named by their hash).
    Nothing is visible under any key until :meth:`commit`; :meth:`abort` leaves nothing behind.
    This default buffers in memory and commits with ``put_atomic``; stores override it to stream.

    A save that writes several packs seals each when full (:meth:`seal`: durable, not yet
    visible where the store can hold it aside, as a local temp file) and publishes them all after
    its last chunk (:meth:`publish`), so a save stopped before that leaves nothing under a final
    name (:meth:`abort` deletes a sealed value that was held aside).  This default cannot hold a
    value aside without keeping it in memory: :meth:`seal` commits it at once."""

    def __init__(self, store: "Store", site: str) -> None:
        self._store = store
        self._site = site
        self._parts: list[bytes] = []
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data``.  A store's writer may hold it until :meth:`seal` or :meth:`commit`
        instead of copying it (the local store does, for a small file): the caller hands over bytes
        it no longer changes."""
        self._parts.append(bytes(data))
        self.size += len(data)

    def commit(self, key: str) -> None:
        self._store.put_atomic(key, b"".join(self._parts), site=self._site)
        self._parts = []

    def seal(self, key: str) -> None:
        """Make the value durable for ``key`` without showing it yet, where the store can."""
        self.commit(key)

    def publish(self) -> None:
        """Show a sealed value under its key (a no-op where :meth:`seal` already did)."""

    def abort(self) -> None:
        self._parts = []


class Store(ABC):
    """A flat key -> bytes map with the few guarantees the repository needs.

    - ``put_atomic`` makes the whole value visible at once, durably, or not at all.
    - ``put_if_absent`` is a compare-and-swap on absence: exactly one of several racing callers wins.
    - ``get`` with ``start``/``length`` reads only that byte range.
    """

    #: put_if_absent is atomic against other processes (O_EXCL, If-None-Match)
    atomic_create: bool = True
    #: keys written by put_atomic survive power loss once it returns
    durable: bool = True
    #: prefetch does something (a reader may give it a thread of its own)
    prefetches: bool = False
    #: writer() writes through stage buffers and takes ``stages=`` (a StagePool) to share them
    #: between files written in turn; a store that leaves it False is never passed one
    stages_writes: bool = False
    #: swap is a compare-and-swap against other processes (If-Match); when False it is
    #: read-compare-put, which is only safe under a lock the caller holds (the refs lock)
    atomic_swap: bool = False

    @abstractmethod
    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        """Bytes of ``key`` (a range when ``length`` is given); ObjectNotFoundError when absent."""

    def read_into(self, key: str, start: int, out: "memoryview | Sequence[memoryview]") -> int:
        """Fill ``out`` with the bytes of ``key`` from ``start`` on; returns how many it got (fewer
        than asked only at the value's end).  ``out``: one byte buffer, or several filled one after
        the other with consecutive bytes (a reader placing objects apart in its buffer).  Reads
        into memory the caller owns and reuses, so a read of many ranges allocates nothing per
        range; stores that can read straight into it (local files) override this default, which
        copies what :meth:`get` returns."""
        outs = [out] if isinstance(out, memoryview) else list(out)
        data = memoryview(self.get(key, start, sum(len(o) for o in outs))).cast("B")
        got = 0
        for o in outs:
            n = min(len(o), len(data) - got)
            o[:n] = data[got:got + n]
            got += n
        return got

    def map_value(self, key: str) -> MappedValue | None:
        """``key``'s value mapped for reading ranges of it in place, or None (this default, and
        any failure: the caller then reads with :meth:`read_into`, which reports the error).  A
        local file's pages come from the page cache without a copy (store/local_map.py)."""
        return None

    def prefetch(self, key: str, start: int, length: int) -> None:
        """A hint that ``key``'s bytes ``[start, start + length)`` will be read soon: a store may
        start fetching them in the background, into memory it does not count as the caller's (the
        page cache).  Never an error; this default does nothing."""

    def get_bounded(self, key: str, max_bytes: int) -> bytes:
        """The whole value of ``key``; LimitExceededError when it holds more than ``max_bytes``.
        Never fetches more than ``max_bytes + 1`` bytes, whatever size the object claims or has
        (stores that can stat cheaply refuse before reading anything)."""
        data = self.get(key, 0, max_bytes + 1)
        if len(data) > max_bytes:
            raise LimitExceededError(f"{key!r} holds more than {max_bytes} bytes, the limit for it")
        return data

    @abstractmethod
    def size(self, key: str) -> int:
        """Length of the value; ObjectNotFoundError when absent."""

    @abstractmethod
    def mtime(self, key: str) -> float:
        """Last modification time (unix seconds); used for grace periods."""

    @abstractmethod
    def put_atomic(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> None:
        """Create or replace ``key`` atomically, and durably unless ``durable`` is False (a lock
        file: it matters only while its writer lives, so a crash may lose it)."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> bool:
        """Create ``key`` unless it exists; True when this call created it (``durable``: as
        :meth:`put_atomic`)."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (a folder-like prefix ending in '/'), sorted."""

    @abstractmethod
    def delete(self, key: str, *, site: str = "delete") -> None:
        """Remove ``key``; absent keys are not an error."""

    def writer(self, *, site: str = "object", owner: str | None = None, stages: "StagePool | None" = None) -> AtomicWriter:
        """A streaming writer for a value committed later under a key chosen then.  ``owner``
        (a save lock's name) marks what it holds aside, so that once that lock is provably dead
        the next save can delete it (:func:`deltackpt.repo.locks.clear_dead_saves`).  ``stages``:
        a :class:`~deltackpt.store.staged_write.StagePool` the caller holds for the files it
        writes in turn, passed only where :attr:`stages_writes` says the store uses one."""
        return AtomicWriter(self, site)

    def swap(self, key: str, expected: bytes | None, data: bytes, *, site: str = "object") -> bool:
        """Replace ``key``'s value by ``data`` only if it is ``expected`` now (``None``: only if
        ``key`` is absent); True when this call replaced it.  Refs move with it, so a writer that
        lost its lock cannot silently overwrite another writer's ``latest``.

        This default reads, compares and puts: atomic only under a lock (see ``atomic_swap``)."""
        if expected is None:
            return self.put_if_absent(key, data, site=site)
        try:
            current = self.get(key, 0, len(expected) + 1)  # a huge (hostile) file is never read whole
        except FileNotFoundError:
            return False
        if current != expected:
            return False
        self.put_atomic(key, data, site=site)
        return True

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except FileNotFoundError:
            return False

    def describe(self) -> str:
        return type(self).__name__


class WrappingStore(Store):
    """A store in front of another: everything is the inner store's unless a subclass overrides
    it, optional capabilities (``sync_dir``, ``temp_files``) included."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.atomic_create = inner.atomic_create
        self.durable = inner.durable
        self.atomic_swap = inner.atomic_swap
        self.prefetches = inner.prefetches

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def describe(self) -> str:
        return self.inner.describe()

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        return self.inner.get(key, start, length)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def mtime(self, key: str) -> float:
        return self.inner.mtime(key)

    def put_atomic(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> None:
        self.inner.put_atomic(key, data, site=site, durable=durable)

    def put_if_absent(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> bool:
        return self.inner.put_if_absent(key, data, site=site, durable=durable)

    def swap(self, key: str, expected: bytes | None, data: bytes, *, site: str = "object") -> bool:
        return self.inner.swap(key, expected, data, site=site)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str, *, site: str = "delete") -> None:
        self.inner.delete(key, site=site)
