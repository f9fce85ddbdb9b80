"""Which indexed chunks a save may reference: those whose object, and every delta base it needs,
lie in a pack that still exists.

Why: a save dedups against the index, and the index outlives its packs when a pack file is lost
(deleted by hand, a failed disk, a sync that skipped it).  Trusting the index alone, every later
version would name chunks that no longer exist and still save without an error.  Checking costs
one ``exists`` per distinct pack a save's dedup hits or delta bases fall in, cached for the save;
a chunk whose pack is gone is written again (a new copy in a new pack, which readers find among
the chunk's copies).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from ...format.limits import MAX_CHAIN_DEPTH
from ...format.pack import PackEntry
from ..layout import pack_key
from ..repository import Repository


class ChunkPresence:
    """Per-save answers to "is this indexed chunk readable from packs that exist?".

    Shared by the save's encoder threads: a pack is asked about once (the first thread asks, the
    others wait for its answer); a chunk's answer is a pure function of those (the save lock keeps
    gc out meanwhile), so two threads judging one chunk at once agree.

    Example::

        presence = ChunkPresence(repo)
        if presence.entry(cid) is None: ...   # write the chunk again instead of referencing it
    """

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._packs: dict[str, Future[bool]] = {}   # pack id -> whether it exists (asked once, by one thread)
        self._chunks: dict[bytes, PackEntry | None] = {}
        self.missing_packs: set[str] = set()
        """Packs the index names that were found missing during this save."""

    def pack_exists(self, pack_id: str) -> bool:
        with self._lock:
            answer = self._packs.get(pack_id)
            asker = answer is None
            if answer is None:
                answer = self._packs[pack_id] = Future()
        if asker:
            # the other threads wait for this one's answer: one request per pack on an object store
            try:
                exists = self.repo.store.exists(pack_key(pack_id))
            except BaseException as exc:
                answer.set_exception(exc)
                raise
            if not exists:
                self.missing_packs.add(pack_id)
            answer.set_result(exists)
        return answer.result()

    def _first_present(self, cid: bytes) -> PackEntry | None:
        """The copy of ``cid`` a reader would use: the first, in index preference order, whose pack exists."""
        for pid, e in self.repo.index.entries_for(cid):
            if self.pack_exists(pid):
                return e
        return None

    def entry(self, cid: bytes) -> PackEntry | None:
        """The index entry of ``cid`` when it and its whole delta chain can be read, else None."""
        if cid in self._chunks:
            return self._chunks[cid]
        first = self._first_present(cid)
        ok = first is not None
        cur, seen = first.base if first is not None else None, {cid}
        while ok and cur is not None:
            if cur in self._chunks:          # a base already judged: its answer is the chain's
                ok = self._chunks[cur] is not None
                break
            e = self._first_present(cur)
            if e is None or cur in seen or len(seen) > MAX_CHAIN_DEPTH:
                ok = False                   # a lost base, or a chain that loops in a damaged index
                break
            seen.add(cur)
            cur = e.base
        self._chunks[cid] = first if ok else None
        return self._chunks[cid]

    def usable(self, cid: bytes) -> bool:
        """Whether a save may reference ``cid`` (or use it as a delta base) without writing it."""
        return self.entry(cid) is not None
