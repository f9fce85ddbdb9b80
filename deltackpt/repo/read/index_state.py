"""The repository's index in memory: every indexed copy of every chunk, loaded from the index
files, and which copy to read (copies.py).  A mixin of :class:`~deltackpt.repo.repository.Repository`:
it uses the repository's store, lock and location."""

from __future__ import annotations

from typing import Iterable

from ...errors import CorruptObjectError, DeltackptError, ObjectNotFoundError
from ...format import index as index_fmt
from ...format.limits import MAX_INDEX_BYTES
from ...format.pack import PackEntry
from ..layout import INDEX
from .copies import Copy, Resolution, resolve


class IndexState:
    _copies: dict[bytes, list[Copy]]
    _resolution: Resolution | None
    _index_files: set[str]
    index_file_packs: dict[str, set[str]]
    pack_entries: dict[str, list[PackEntry]]
    bad_index_files: dict[str, str]

    def refresh_index(self) -> None:
        """Load index files written since the last refresh (by this or another process)."""
        with self._lock:
            for attempt in range(5):
                keys = self.store.list(INDEX)
                current = set(keys)
                if not self._index_files <= current:
                    # gc (or a save dropping superseded keyframes) replaced index files: start over
                    self.forget_index()
                try:
                    for key in keys:
                        if key in self._index_files:
                            continue
                        try:
                            packs = index_fmt.decode(self.store.get_bounded(key, MAX_INDEX_BYTES), what=key)
                        except CorruptObjectError as exc:
                            # one damaged index file must not make every version unreadable: its
                            # chunks read as missing (typed errors), verify names the versions, and
                            # rebuild_index() restores the entries from the packs.  A version byte
                            # this reader does not know is no damage: FormatVersionError propagates
                            self.bad_index_files[key] = str(exc)
                            self._index_files.add(key)
                            continue
                        for pid, (_plen, entries) in packs.items():
                            self.add_index_entries(pid, entries)
                        self.note_index_file(key, packs)
                    return
                except (ObjectNotFoundError, FileNotFoundError):
                    continue  # an index file vanished under us (gc): list again
            raise DeltackptError(f"{self.location}: index kept changing while loading; retry")

    def forget_index(self) -> None:
        """Drop everything loaded from index files (the next refresh reads them all again)."""
        with self._lock:
            self._copies.clear()
            self._resolution = None
            self._index_files.clear()
            self.index_file_packs.clear()
            self.pack_entries.clear()
            self.bad_index_files.clear()

    @property
    def resolution(self) -> Resolution:
        """Each chunk's shortest real chain and the copy that gives it (recomputed after the index grew)."""
        res = self._resolution
        if res is None:
            with self._lock:
                res = self._resolution
                if res is None:
                    res = self._resolution = resolve(self._copies)
        return res

    def has_chunk(self, cid: bytes) -> bool:
        return cid in self._copies

    def entry(self, cid: bytes) -> tuple[str, PackEntry]:
        """The copy of ``cid`` to read (the first indexed one when no copy's chain resolves)."""
        best = self.resolution.best.get(cid)
        if best is not None:
            return best
        copies = self._copies.get(cid)
        if copies:
            return copies[0]
        hint = f"; damaged index files: {sorted(self.bad_index_files)} (run rebuild_index)" if self.bad_index_files else ""
        raise CorruptObjectError(f"chunk {cid.hex()} is not in the index (missing pack or index file){hint}")

    def add_index_entries(self, pack_id: str, entries: Iterable[PackEntry]) -> None:
        """Index a pack's entries (a chunk indexed twice in one pack counts once)."""
        with self._lock:
            known = self.pack_entries.setdefault(pack_id, [])
            fresh = not known
            for e in entries:
                copies = self._copies.setdefault(e.chunk_id, [])
                if not fresh and any(p == pack_id for p, _ in copies):
                    continue
                copies.append((pack_id, e))
                known.append(e)
            self._resolution = None

    def entries_for(self, cid: bytes) -> list[tuple[str, PackEntry]]:
        """Every known copy of a chunk, the one with the shortest real chain first."""
        copies = self._copies.get(cid)
        if not copies:
            return []
        return copies if len(copies) == 1 else self.resolution.order(copies)

    def chain_depth(self, cid: bytes) -> int | None:
        """Links from ``cid`` down to a keyframe along its best copies (0: a keyframe), None when its
        chain does not resolve."""
        return self.resolution.depth.get(cid)

    def note_index_file(self, key: str, packs: Iterable[str] = ()) -> None:
        self._index_files.add(key)
        self.index_file_packs[key] = set(packs)

    def replace_index_files(self, removed: Iterable[str], added: dict[str, dict]) -> None:
        """Mirror in memory what a writer just did on disk: index files ``removed`` are gone (and
        with them every pack only they named), the files in ``added`` ({key: {pack id: (pack length,
        entries)}}) are new."""
        with self._lock:
            gone: set[str] = set()
            for key in removed:
                gone |= self.index_file_packs.pop(key, set())
                self._index_files.discard(key)
            still = set().union(*self.index_file_packs.values(), *(set(p) for p in added.values()))
            for pid in gone - still:
                for e in self.pack_entries.pop(pid, ()):
                    copies = [c for c in self._copies.get(e.chunk_id, ()) if c[0] != pid]
                    if copies:
                        self._copies[e.chunk_id] = copies
                    else:
                        self._copies.pop(e.chunk_id, None)
            for key, packs in added.items():
                for pid, (_plen, entries) in packs.items():
                    if pid not in self.pack_entries:
                        self.add_index_entries(pid, entries)
                self.note_index_file(key, packs)
            self._resolution = None

    def resolve_copies(self, usable=None, extra=()) -> Resolution:
        """The copy choice (copies.resolve) over a subset of packs, taken while no other thread of
        this process changes the index."""
        with self._lock:
            return resolve(self._copies, usable, extra)

    def index_items(self, *, all_copies: bool = False) -> list[tuple[bytes, str, PackEntry]]:
        """(chunk id, pack id, entry) for the copy of each chunk to read, or for every copy."""
        if all_copies:
            return [(cid, pid, e) for cid, cps in self._copies.items() for pid, e in cps]
        return [(cid, *self.entry(cid)) for cid in self._copies]


    def chunk_closure(self, chunk_ids: Iterable[bytes]) -> set[bytes]:
        """The chunks and every delta base they need."""
        out: set[bytes] = set()
        for cid in chunk_ids:
            cur: bytes | None = cid
            while cur is not None and cur not in out:
                out.add(cur)
                cur = self.entry(cur)[1].base if cur in self._copies else None
        return out

    def stored_size(self, chunk_ids: Iterable[bytes]) -> int:
        return sum(self.entry(c)[1].length for c in chunk_ids if c in self._copies)

