"""Streaming a save's objects into pack files, then one index file naming them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..format import index as index_fmt
from ..format.ids import hex_id
from ..format.limits import PACK_MAX_OBJECTS, PACK_TARGET_BYTES
from ..format.pack import PackStream
from .layout import INDEX, pack_key
from .repository import Repository

if TYPE_CHECKING:
    from .saver import SaveStats


class Packer:
    """Streams objects into pack files as they arrive (the write syscalls overlap the workers'
    encoding), then writes one index file for the packs of this save."""

    def __init__(self, repo: Repository, stats: SaveStats) -> None:
        self.repo = repo
        self.stats = stats
        self.stream: PackStream | None = None
        self.writer = None
        self.written: dict[str, tuple[int, list]] = {}
        self.pending: set[bytes] = set()

    def add(self, r) -> None:
        assert r.parts is not None
        if self.stream is None:
            self.writer = self.repo.store.writer(site="pack")
            self.stream = PackStream(self.writer.write)
        self.stream.add(r.cid, r.parts, encoding=r.encoding, raw_len=r.raw_len, base=r.base, depth=r.depth)
        self.pending.add(r.cid)
        if self.stream.size >= PACK_TARGET_BYTES or len(self.stream) >= PACK_MAX_OBJECTS:
            self.flush()

    def flush(self) -> None:
        if self.stream is None:
            return
        stream, writer = self.stream, self.writer
        self.stream = self.writer = None
        pid = stream.finish()
        writer.commit(pack_key(pid))
        self.written[pid] = (stream.size, list(stream.entries))
        self.stats.packs += 1
        self.stats.objects_bytes += stream.size

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
        self.stream = self.writer = None

    def finish(self) -> None:
        self.flush()
        if not self.written:
            return
        data = index_fmt.encode(self.written)
        key = INDEX + hex_id(data)
        self.repo.store.put_atomic(key, data, site="index")
        for pid, (_plen, entries) in self.written.items():
            self.repo.add_index_entries(pid, entries)
        self.repo.note_index_file(key, self.written)
