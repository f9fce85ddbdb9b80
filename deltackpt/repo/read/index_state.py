"""The repository's index in memory: every indexed copy of every chunk, loaded from the index
files, and which copy to read (copies.py).  A :class:`~deltackpt.repo.repository.Repository` holds
one :class:`Index` (``repo.index``); the chunk reader reads through it.

Version-2 index files (format 3) are kept as their checked columns (format/index_table.py) until
something needs every copy (a writer, gc, verify): a reader asks only for the chunks it reads and
their chains (:meth:`Index.prepare`), and the copy choice is made over those alone.  A restart after
a long history so reads the newest version without building an entry per stored copy.

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
from ...format.index_table import IndexTable
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
        self._copies: dict[bytes, list[Copy]] = {}
        self._resolution: Resolution | None = None
        # chunks indexed for the first time since the copy choice was made: it is extended with
        # them when next asked for (copies.extended), once for every pack a refresh added
        self._fresh: dict[bytes, list[Copy]] = {}
        self._files: set[str] = set()
        self.file_packs: dict[str, set[str]] = {}  # index key -> the packs it names
        self._pack_entries: dict[str, list[PackEntry]] = {}  # pack id -> its indexed entries
        self.bad_files: dict[str, str] = {}  # index key -> why it was skipped
        # version-2 files not yet added to the copies above, and what a reader looked up in them:
        # the copies of the chunks it asked for and of their chains' bases (a closed set, so the
        # copy choice over it is the choice over every copy), the ids no file holds, and that choice
        self._tables: list[IndexTable] = []
        self._looked: dict[bytes, list[Copy]] = {}
        self._absent: set[bytes] = set()
        self._looked_res: Resolution | None = None

    @property
    def holds_every_copy(self) -> bool:
        """Whether every loaded entry is in memory (False while version-2 files are only searched)."""
        return not self._tables

    @property
    def copies(self) -> dict[bytes, list[Copy]]:
        """Every indexed copy of every chunk: {chunk id: [(pack id, entry), ...]}."""
        if self._tables:
            self._materialize()
        return self._copies

    @property
    def pack_entries(self) -> dict[str, list[PackEntry]]:
        """{pack id: its indexed entries}."""
        if self._tables:
            self._materialize()
        return self._pack_entries

    def hold_every_copy(self) -> None:
        """Build every entry of the version-2 files kept as columns now (a writer whose
        maintenance will need them all, rather than after looking chunks up one by one)."""
        if self._tables:
            self._materialize()

    def _materialize(self) -> None:
        """Add every entry of the version-2 files kept as columns (once something needs them all).
        The columns stay the readers' until the last entry is in: a reader looks up under the
        same lock, and finds them gone only once every copy is in memory."""
        with self._lock:
            for table in self._tables:
                for pid, (_plen, entries) in table.packs().items():
                    self._add(pid, entries)
            self._tables = []
            self._forget_looked()

    def _forget_looked(self) -> None:
        self._looked, self._absent, self._looked_res = {}, set(), None

    def prepare(self, chunk_ids: Iterable[bytes]) -> None:
        """Look up ``chunk_ids`` and every base their copies name, in one pass per round over the
        version-2 files kept as columns, and choose their copies (nothing to do once every entry
        is in memory).  A reader calls it with the chunks it is about to read."""
        if not self._tables:
            return
        with self._lock:
            if not self._tables:
                return
            looked, absent = self._looked, self._absent
            fresh: dict[bytes, list[Copy]] = {}
            want = [c for c in dict.fromkeys(chunk_ids) if c not in looked and c not in absent]
            while want:
                found: dict[bytes, list[Copy]] = {c: list(self._copies.get(c, ())) for c in want}
                known: set[str] = set()   # packs earlier files index (Index.add_entries' rule)
                for table in self._tables:
                    table.lookup(want, found, known)
                    known |= table.filled
                nxt: dict[bytes, None] = {}
                for cid, cps in found.items():
                    if not cps:
                        absent.add(cid)
                        continue
                    fresh[cid] = cps
                    for _pid, e in cps:
                        b = e.base
                        if b is not None and b not in looked and b not in fresh and b not in absent and b not in found:
                            nxt[b] = None
                want = list(nxt)
            if not fresh:
                return
            looked.update(fresh)
            res = self._looked_res
            # grown in place: lookups one chunk at a time (a save's) would copy the choice each time;
            # a reader holding it sees only chunks added, every earlier choice stays as it was
            got = extended(res, fresh, in_place=True) if res is not None else None
            self._looked_res = got if got is not None else resolve(looked)

    def _lookup(self, cid: bytes) -> tuple[list[Copy], Resolution | None] | None:
        """``cid``'s copies and the choice among them while version-2 files are kept as columns;
        None once every copy is in memory (then ask ``copies`` and ``resolution``)."""
        with self._lock:
            if not self._tables:
                return None
            self.prepare((cid,))
            return self._looked.get(cid, []), self._looked_res

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
                            packs = index_fmt.decode_any(self.store.get_bounded(key, MAX_INDEX_BYTES), what=key)
                        except CorruptObjectError as exc:
                            # one damaged index file must not make every version unreadable: its
                            # chunks read as missing (typed errors), verify names the versions, and
                            # rebuild_index() restores the entries from the packs.  A version byte
                            # this reader does not know is no damage: FormatVersionError propagates
                            self.bad_files[key] = str(exc)
                            self._files.add(key)
                            continue
                        if isinstance(packs, IndexTable):
                            if self._resolution is None and not self._copies:
                                # nothing needs every copy yet: keep the columns, look up on demand
                                self._tables.append(packs)
                                self._forget_looked()
                                self.note_file(key, packs.pack_ids)
                                continue
                            packs = packs.packs()
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
            self._copies.clear()
            self._drop_resolution()
            self._files.clear()
            self.file_packs.clear()
            self._pack_entries.clear()
            self.bad_files.clear()
            self._tables = []
            self._forget_looked()

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
        got = self._lookup(cid) if self._tables else None
        return cid in self._copies if got is None else bool(got[0])

    def entry(self, cid: bytes) -> tuple[str, PackEntry]:
        """The copy of ``cid`` to read (the first indexed one when no copy's chain resolves)."""
        got = self._lookup(cid) if self._tables else None
        res: Resolution | None
        if got is None:
            res, copies = self.resolution, self._copies.get(cid, [])
        else:
            copies, res = got
        best = None if res is None else res.best.get(cid)
        if best is not None:
            return best
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
            if self._tables:
                self._materialize()
            self._add(pack_id, entries)

    def _add(self, pack_id: str, entries: Iterable[PackEntry]) -> None:
        with self._lock:
            known = self._pack_entries.setdefault(pack_id, [])
            fresh_pack = not known
            new = self._fresh
            again = False
            every = self._copies
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
        got = self._lookup(cid) if self._tables else None
        if got is not None:
            copies, res = got
            return copies if len(copies) <= 1 or res is None else res.order(copies)
        known = self._copies.get(cid)
        if not known:
            return []
        return known if len(known) == 1 else self.resolution.order(known)

    def chain_depth(self, cid: bytes) -> int | None:
        """Links from ``cid`` down to a keyframe along its best copies (0: a keyframe), None when its
        chain does not resolve."""
        got = self._lookup(cid) if self._tables else None
        if got is not None:
            return None if got[1] is None else got[1].depth.get(cid)
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
        chunk_ids = list(chunk_ids)
        self.prepare(chunk_ids)
        for cid in chunk_ids:
            cur: bytes | None = cid
            while cur is not None and cur not in out:
                out.add(cur)
                cur = self.entry(cur)[1].base if self.has_chunk(cur) else None
        return out

    def stored_size(self, chunk_ids: Iterable[bytes]) -> int:
        chunk_ids = list(chunk_ids)
        self.prepare(chunk_ids)
        return sum(self.entry(c)[1].length for c in chunk_ids if self.has_chunk(c))

