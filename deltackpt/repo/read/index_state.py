"""The repository's index in memory: every indexed copy of every chunk, loaded from the index
files, and which copy to read (copies.py).  A :class:`~deltackpt.repo.repository.Repository` holds
one :class:`Index` (``repo.index``); the chunk reader reads through it.

Example::

    index = Index(store, "ckpt")
    index.refresh()
    pack_id, entry = index.entry(chunk_id)
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

from ...errors import CorruptObjectError, DeltackptError, ObjectNotFoundError
from ...format import index as index_fmt
from ...format.limits import MAX_INDEX_BYTES
from ...format.pack import PackEntry
from ...store.base import Store
from ..layout import INDEX
from .copies import Copy, Resolution, extended, resolve, without


class Index:
    """Every indexed copy of every chunk of one repository, as loaded from its index files.

    Thread-safe: the save's encoder threads and a load's decode threads consult it while a refresh
    may add to it."""

    def __init__(self, store: Store, location: str) -> None:
        self.store, self.location = store, location
        self._lock = threading.RLock()
        # every indexed copy of every chunk, in index order; which one to read is computed (copies.py)
        self.copies: dict[bytes, list[Copy]] = {}
        self._resolution: Resolution | None = None
        # chunks indexed for the first time since the copy choice was made: it is extended with
        # them when next asked for (copies.extended), once for every pack a refresh added
        self._fresh: dict[bytes, list[Copy]] = {}
        self._files: set[str] = set()
        self.file_packs: dict[str, set[str]] = {}  # index key -> the packs it names
        self.pack_entries: dict[str, list[PackEntry]] = {}  # pack id -> its indexed entries
        self.bad_files: dict[str, str] = {}  # index key -> why it was skipped

    def refresh(self) -> None:
        """Load index files written since the last refresh (by this or another process)."""
        with self._lock:
            for attempt in range(5):
                keys = self.store.list(INDEX)
                current = set(keys)
                if not self._files <= current:
                    # gc (or a save dropping superseded keyframes) replaced index files: start over
                    self.forget()
                try:
                    for key in keys:
                        if key in self._files:
                            continue
                        try:
                            packs = index_fmt.decode(self.store.get_bounded(key, MAX_INDEX_BYTES), what=key)
                        except CorruptObjectError as exc:
                            # one damaged index file must not make every version unreadable: its
                            # chunks read as missing (typed errors), verify names the versions, and
                            # rebuild_index() restores the entries from the packs.  A version byte
                            # this reader does not know is no damage: FormatVersionError propagates
                            self.bad_files[key] = str(exc)
                            self._files.add(key)
                            continue
                        for pid, (_plen, entries) in packs.items():
                            self.add_entries(pid, entries)
                        self.note_file(key, packs)
                    return
                except (ObjectNotFoundError, FileNotFoundError):
                    continue  # an index file vanished under us (gc): list again
            raise DeltackptError(f"{self.location}: index kept changing while loading; retry")

    def forget(self) -> None:
        """Drop everything loaded from index files (the next refresh reads them all again)."""
        with self._lock:
            self.copies.clear()
            self._drop_resolution()
            self._files.clear()
            self.file_packs.clear()
            self.pack_entries.clear()
            self.bad_files.clear()

    @property
    def resolution(self) -> Resolution:
        """Each chunk's shortest real chain and the copy that gives it: extended with the chunks
        indexed since, or computed again after a change to the copies of chunks indexed before."""
        res = self._resolution
        if res is None or self._fresh:
            with self._lock:
                res = self._resolution
                if res is not None and self._fresh:
                    res = extended(res, self._fresh)
                    self._fresh = {}
                if res is None:
                    res = resolve(self.copies)
                    self._fresh = {}
                self._resolution = res
        return res

    def _drop_resolution(self) -> None:
        self._resolution = None
        self._fresh = {}

    def has_chunk(self, cid: bytes) -> bool:
        return cid in self.copies

    def entry(self, cid: bytes) -> tuple[str, PackEntry]:
        """The copy of ``cid`` to read (the first indexed one when no copy's chain resolves)."""
        best = self.resolution.best.get(cid)
        if best is not None:
            return best
        copies = self.copies.get(cid)
        if copies:
            return copies[0]
        hint = f"; damaged index files: {sorted(self.bad_files)} (run rebuild_index)" if self.bad_files else ""
        raise CorruptObjectError(f"chunk {cid.hex()} is not in the index (missing pack or index file){hint}")

    def add_entries(self, pack_id: str, entries: Iterable[PackEntry]) -> None:
        """Index a pack's entries (a chunk indexed twice in one pack counts once).  The copy
        choice will be extended with the chunks indexed for the first time (a save's new pack:
        every save used to walk the whole index again, a cost that grew with the history); a new
        copy of a chunk indexed before makes it computed again."""
        with self._lock:
            known = self.pack_entries.setdefault(pack_id, [])
            fresh_pack = not known
            new = self._fresh
            again = False
            every = self.copies
            for e in entries:
                cid = e.chunk_id
                copies = every.get(cid)
                if copies is None:   # the common case, kept short: an index holds one per stored copy
                    copies = every[cid] = [(pack_id, e)]
                    new[cid] = copies
                    known.append(e)
                    continue
                if cid not in new:
                    again = True
                if not fresh_pack and any(p == pack_id for p, _ in copies):
                    continue
                copies.append((pack_id, e))
                known.append(e)
            if again or self._resolution is None:
                self._drop_resolution()   # (nothing to extend: the next choice is computed whole)

    def entries_for(self, cid: bytes) -> list[tuple[str, PackEntry]]:
        """Every known copy of a chunk, the one with the shortest real chain first."""
        copies = self.copies.get(cid)
        if not copies:
            return []
        return copies if len(copies) == 1 else self.resolution.order(copies)

    def chain_depth(self, cid: bytes) -> int | None:
        """Links from ``cid`` down to a keyframe along its best copies (0: a keyframe), None when its
        chain does not resolve."""
        return self.resolution.depth.get(cid)

    def note_file(self, key: str, packs: Iterable[str] = ()) -> None:
        self._files.add(key)
        self.file_packs[key] = set(packs)

    def replace_files(self, removed: Iterable[str], added: dict[str, dict]) -> None:
        """Mirror in memory what a writer just did on disk: index files ``removed`` are gone (and
        with them every pack only they named), the files in ``added`` ({key: {pack id: (pack length,
        entries)}}) are new."""
        with self._lock:
            gone: set[str] = set()
            for key in removed:
                gone |= self.file_packs.pop(key, set())
                self._files.discard(key)
            still = set().union(*self.file_packs.values(), *(set(p) for p in added.values()))
            # index files merged into one (consolidate.py) name the same packs: the same copies
            same = not gone - still and all(pid in self.pack_entries for p in added.values() for pid in p)
            for pid in gone - still:
                for e in self.pack_entries.pop(pid, ()):
                    copies = [c for c in self.copies.get(e.chunk_id, ()) if c[0] != pid]
                    if copies:
                        self.copies[e.chunk_id] = copies
                    else:
                        self.copies.pop(e.chunk_id, None)
            for key, packs in added.items():
                for pid, (_plen, entries) in packs.items():
                    if pid not in self.pack_entries:
                        self.add_entries(pid, entries)
                self.note_file(key, packs)
            if not same:
                self._drop_resolution()

    def resolve_copies(self, usable: Callable[[str], bool] | None = None,
                       extra: Iterable[tuple[bytes, Copy]] = ()) -> Resolution:
        """The copy choice (copies.resolve) over a subset of packs, taken while no other thread of
        this process changes the index."""
        with self._lock:
            return resolve(self.copies, usable, extra)

    def resolve_without(self, unusable: set[str], extra: Iterable[tuple[bytes, Copy]] = ()) -> Resolution:
        """:meth:`resolve_copies` with every pack but ``unusable`` (copies.without: only the chunks
        whose chain passed through those packs are walked again)."""
        extra = list(extra)
        with self._lock:
            got = without(self.resolution, self.copies, self.pack_entries, unusable, extra)
            return got if got is not None else resolve(self.copies, lambda pid: pid not in unusable, extra)

    def items(self, *, all_copies: bool = False) -> list[tuple[bytes, str, PackEntry]]:
        """(chunk id, pack id, entry) for the copy of each chunk to read, or for every copy."""
        if all_copies:
            return [(cid, pid, e) for cid, cps in self.copies.items() for pid, e in cps]
        return [(cid, *self.entry(cid)) for cid in self.copies]


    def chunk_closure(self, chunk_ids: Iterable[bytes]) -> set[bytes]:
        """The chunks and every delta base they need."""
        out: set[bytes] = set()
        for cid in chunk_ids:
            cur: bytes | None = cid
            while cur is not None and cur not in out:
                out.add(cur)
                cur = self.entry(cur)[1].base if cur in self.copies else None
        return out

    def stored_size(self, chunk_ids: Iterable[bytes]) -> int:
        return sum(self.entry(c)[1].length for c in chunk_ids if c in self.copies)

