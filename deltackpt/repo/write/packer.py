"""Streaming a save's objects into pack files, then one index file naming them."""

from __future__ import annotations

from typing import Protocol

from ...errors import DeltackptError
from ...format.ids import hex_id
from ...format.limits import PACK_MAX_OBJECTS, PACK_TARGET_BYTES
from ...format.pack import PackStream
from ..layout import INDEX, pack_key
from ..locks import delete_save_temps
from ...store.base import AtomicWriter
from ...store.staged_write import StagePool
from ..repository import Repository
from .deltify_plan import MIN_POSITION_BYTES


class PackCounts(Protocol):
    """What a packer counts: a save's ``saver.SaveStats``, deltify's own counts."""

    packs: int
    objects_bytes: int


class PackObject(Protocol):
    """An object to pack: a save's ``chunk_encoder.ChunkResult``, deltify's reverse deltas
    (read-only here, hence properties: the two spell ``parts`` and ``base`` with Optional or not)."""

    @property
    def cid(self) -> bytes: ...

    @property
    def raw_len(self) -> int: ...

    @property
    def parts(self) -> list | None: ...

    @property
    def encoding(self) -> int: ...

    @property
    def base(self) -> bytes | None: ...

    @property
    def depth(self) -> int: ...


class Packer:
    """Streams objects into pack files as they arrive (the write syscalls overlap the workers'
    encoding), then writes one index file for the packs of this save.

    Keyframes likely to stay whole (``r.lasting``: head.stays_whole) go to a pack of their own,
    so that deltification, which later drops the packs of the keyframes it re-stores as deltas,
    finds those packs wholly redundant and never copies the lasting ones out of them.  Objects of
    chunks under ``MIN_POSITION_BYTES`` join them: deltification never rewrites those either
    (deltify_plan.py), and a save of a small model whose large chunks all stay whole then writes
    one pack, not a second one of a few KiB (two fsyncs and a folder more).

    A full pack is sealed (durable, held aside as a temp file named after ``owner``, the save
    lock), and every pack is published under its final name only in :meth:`finish`, right before
    the index: a save stopped earlier (an error, Ctrl-C, a second Ctrl-C at exit) deletes them all
    in :meth:`abort`, and one killed leaves only temp files the next save deletes once its lock
    is provably dead (spec/FORMAT.md §13)."""

    def __init__(self, repo: Repository, stats: PackCounts, owner: str | None = None) -> None:
        self.repo = repo
        self.stats = stats
        self.owner = owner
        self.open: dict[bool, tuple[PackStream, AtomicWriter]] = {}   # lasting? -> the pack being written
        self.sealed: list[AtomicWriter] = []   # writers of full packs, published by finish()
        self.written: dict[str, tuple[int, list]] = {}
        self.index_bytes = 0   # the index file finish() wrote
        self.pending: set[bytes] = set()
        # the packs are written one after another (two lanes at most side by side): each takes
        # its stage buffers from the last one's instead of mapping fresh ones (store/staged_write.py)
        self.stages = StagePool()

    def add(self, r: PackObject) -> None:
        assert r.parts is not None
        lane = bool(getattr(r, "lasting", False)) or r.raw_len < MIN_POSITION_BYTES
        if lane not in self.open:
            store = self.repo.store
            writer = (store.writer(site="pack", owner=self.owner, stages=self.stages) if store.stages_writes
                      else store.writer(site="pack", owner=self.owner))
            self.open[lane] = (PackStream(writer.write), writer)
        stream = self.open[lane][0]
        stream.add(r.cid, r.parts, encoding=r.encoding, raw_len=r.raw_len, base=r.base, depth=r.depth)
        self.pending.add(r.cid)
        if stream.size >= PACK_TARGET_BYTES or len(stream) >= PACK_MAX_OBJECTS:
            self._seal(lane)

    def _seal(self, lane: bool) -> None:
        # the writer leaves ``open`` only once it is in ``sealed``: a Ctrl-C lands after the
        # syscall it interrupted (the fsync of 64 MiB, most likely), and abort() must still find it
        stream, writer = self.open[lane]
        pid = stream.finish()
        writer.seal(pack_key(pid))
        self.sealed.append(writer)
        del self.open[lane]
        self.written[pid] = (stream.size, list(stream.entries))
        self.stats.packs += 1
        self.stats.objects_bytes += stream.size

    def flush(self) -> None:
        for lane in sorted(self.open):
            self._seal(lane)

    def abort(self) -> None:
        """Delete every pack of this save not yet published (those being written included)."""
        # once each: a Ctrl-C inside _seal can leave a writer in both lists
        for w in {id(w): w for w in [*(w for _s, w in self.open.values()), *self.sealed]}.values():
            w.abort()
        self.open = {}
        self.sealed = []
        self.stages.close()
        # a Ctrl-C between a writer creating its temp file and add() recording that writer leaves
        # a file no list names; the owner's mark in its name finds it (only this save has it)
        if self.owner:
            try:
                delete_save_temps(self.repo.store, self.owner)
            except (DeltackptError, OSError):
                pass   # the caller's own error matters more; gc deletes temp files past its grace

    def finish(self) -> None:
        self.flush()
        self.stages.close()   # every pack is sealed: their stages are back, and unmapped here
        while self.sealed:
            self.sealed[0].publish()
            self.sealed.pop(0)
        if not self.written:
            return
        data = self.repo.encode_index(self.written)
        key = INDEX + hex_id(data)
        self.repo.store.put_atomic(key, data, site="index")
        self.index_bytes = len(data)
        for pid, (_plen, entries) in self.written.items():
            self.repo.index.add_entries(pid, entries)
        self.repo.index.note_file(key, self.written)
