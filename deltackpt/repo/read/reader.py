"""Reading chunks: fetch an object from its pack (trying other indexed copies when a pack is gone),
walk its delta chain to a keyframe, decode, and check every link against its id."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Iterable

from ...codecs import registry
from ...codecs.base import Room
from ...errors import CorruptObjectError, DeltackptError, ObjectNotFoundError
from ...format import objects
from ...format.ids import digest
from ...format.limits import MAX_CHAIN_DEPTH
from ...format.manifest import Blob
from ...format.pack import PackEntry
from ..layout import pack_key
from ...store.base import Store
from .copies import PackGone
from .index_state import Index
from .live import rehydrate
from .populate import populate
from .stream import Span, SpanStream

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from ...codecs.base import Codec

#: one stored copy of a chunk's object, as read: (pack id, index entry, object)
# a chunk's own copy, already read: (pack id, entry, object[, the room around its payload in the span])
Fetched = tuple[str, PackEntry, objects.EncodedObject] | tuple[str, PackEntry, objects.EncodedObject, "Room"]


# Objects that follow each other in a pack (a save writes a blob's chunks, and tensor after tensor,
# in order) are read with one request of up to READ_SPAN bytes, which is also one pool task (its
# chunks decode to at most READ_SPAN bytes too, so tasks carry similar work).  Only back-to-back
# objects are merged (READ_GAP = 0), so a layer restore reads no byte it does not need.  4 MiB:
# as fast as 8 on the GPT-2 and MiniLM loads of `python -m bench load_speed`, half the span buffers.
READ_GAP = 0
READ_SPAN = 4 * 1024 * 1024
# While the pool decodes, the calling thread reads the next spans into SPARE_SPANS more buffers than
# the pool has workers, and asks the store to prefetch READ_AHEAD bytes beyond the span it reads
# (stream.py): a cold read keeps the disk busy while every core decodes.  16 MiB, not 64: the disk
# serves what is asked of it side by side, so with 64 MiB in flight the span the reader waits for
# came in with the rest of the window and the decoders sat idle (a cold MiniLM load on the project
# machine: 60-110 ms of idle core time, 30-60 with 16 MiB).
SPARE_SPANS = 2
READ_AHEAD = 16 * 1024 * 1024
# Each object of a span is read into its own room of the span buffer (codecs.base.Room): ROOM_HEAD
# bytes before it, where a c-blosc frame header (24 bytes) fits over the object's own header, and
# after it as many bytes as it decodes to beyond its length plus ROOM_TAIL (the codec parameters:
# ~110 bytes for 16 planes).  So a keyframe's planes are interleaved from where the read put them.
ROOM_HEAD = 32
ROOM_TAIL = 128
MAX_COPIES_TRIED = 8   # damaged copies of one chunk skipped before a read gives up


class DecodedCache:
    """A small LRU of decoded chunks, so delta bases shared by reads are decoded once."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, bytes | memoryview] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, cid: bytes) -> bytes | memoryview | None:
        with self._lock:
            data = self._items.get(cid)
            if data is not None:
                self._items.move_to_end(cid)
            return data

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def put(self, cid: bytes, data: bytes | memoryview) -> None:
        if len(data) > self.max_bytes // 4:
            return
        with self._lock:
            if cid in self._items:
                return
            self._items[cid] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)


class ChunkReader:
    """The read path of a repository (``repo.chunks``): objects fetched from packs through the
    index, delta chains walked and checked link by link, blobs decoded into their destinations.

    Example::

        reader = ChunkReader(store, index, DecodedCache(256 << 20))
        data = reader.read_chunk(chunk_id)
    """

    def __init__(self, store: Store, index: Index, decoded: DecodedCache) -> None:
        self.store, self.index, self.decoded = store, index, decoded

    def entries_for(self, cid: bytes) -> list[tuple[str, PackEntry]]:
        """Every indexed copy of ``cid``, the best first (what live rollback reads through)."""
        return self.index.entries_for(cid)

    def read_object(self, pack_id: str, e: PackEntry) -> objects.EncodedObject:
        try:
            data = self.store.get(pack_key(pack_id), e.offset, e.length)
        except (ObjectNotFoundError, FileNotFoundError):
            raise PackGone(f"chunk {e.chunk_id.hex()} in pack {pack_id}: pack file is missing") from None
        return self._check_object(pack_id, e, data)

    @staticmethod
    def _check_object(pack_id: str, e: PackEntry, data: bytes | memoryview) -> objects.EncodedObject:
        what = f"chunk {e.chunk_id.hex()} in pack {pack_id}"
        if len(data) != e.length:
            raise CorruptObjectError(f"{what}: pack is truncated")
        obj = objects.parse(data, what=what)
        if obj.encoding != e.encoding or obj.raw_len != e.raw_len:
            raise CorruptObjectError(f"{what}: object header disagrees with the index")
        base = obj.params.get("base")
        if (base if isinstance(base, bytes) else None) != e.base:
            raise CorruptObjectError(f"{what}: object base disagrees with the index")
        return obj

    def read_chunk(self, cid: bytes, out: memoryview | None = None,
                   first: Fetched | None = None) -> bytes | memoryview:
        """Decoded bytes of a chunk, walking its delta chain; hash-checked against its id.
        With ``out``, the last link decodes straight into it (and ``out`` is returned).
        ``first``: the chunk's own (pack id, entry, object), already read by the caller, and
        optionally the Room around the object's payload (a keyframe may decode there).
        A copy that fails its checks is skipped for the chunk's other copies (spec §8), and the
        first failure is raised only when none of them decodes."""
        avoid: set[tuple[str, int]] = set()
        failure: CorruptObjectError | None = None
        refreshed = False
        while True:
            try:
                return self._read_chunk(cid, out, None if avoid else first, avoid)
            except PackGone:
                if refreshed:
                    raise
                # gc may have repacked (and rebased) this chunk since our index was loaded: look again
                refreshed = True
                self.index.refresh()
            except CorruptObjectError as exc:
                bad = getattr(exc, "bad_copy", None)
                if bad is None or bad in avoid or len(avoid) >= MAX_COPIES_TRIED:
                    raise failure or exc
                failure = failure or exc
                avoid.add(bad)

    def _fetch(self, cid: bytes, avoid: "set[tuple[str, int]] | frozenset" = frozenset(),
               ) -> tuple[str, PackEntry, objects.EncodedObject]:
        """Read one stored copy of a chunk's object (not one in ``avoid``), trying other copies
        when a pack is gone or an object's header is damaged."""
        copies = [(pid, e) for pid, e in self.index.entries_for(cid) if (pid, e.offset) not in avoid]
        if not copies:
            raise CorruptObjectError(f"chunk {cid.hex()} is not in the index (missing pack or index file)")
        damaged: CorruptObjectError | None = None
        for pid, e in copies:
            try:
                return pid, e, self.read_object(pid, e)
            except PackGone:
                continue
            except CorruptObjectError as exc:
                damaged = damaged or exc
        if damaged is not None:
            raise damaged
        raise PackGone(f"chunk {cid.hex()}: every pack holding it ({', '.join(p for p, _ in copies)}) is missing")

    def _read_chunk(self, cid: bytes, out: memoryview | None, first: Fetched | None = None,
                    avoid: "set[tuple[str, int]] | frozenset" = frozenset()) -> bytes | memoryview:
        cached = self.decoded.get(cid)
        if cached is not None:
            if out is None:
                return cached
            out[:] = memoryview(cached).cast("B")
            return out
        # walk to a keyframe (or a decoded base), reading the copy that exists of each link
        chain: list[tuple[bytes, str, PackEntry, objects.EncodedObject]] = []
        cur: bytes | None = cid
        base_data: bytes | memoryview | None = None
        seen: set[bytes] = set()
        while cur is not None:
            if cur in seen or len(chain) > MAX_CHAIN_DEPTH:
                raise CorruptObjectError(f"chunk {cid.hex()}: delta chain loops or exceeds {MAX_CHAIN_DEPTH}")
            seen.add(cur)
            if chain:
                base_data = self.decoded.get(cur)
                if base_data is not None:
                    break
            pid, e, obj = first[:3] if first is not None and cur == cid else self._fetch(cur, avoid)
            chain.append((cur, pid, e, obj))
            cur = e.base
        links = chain[::-1]
        if out is not None:
            # the oldest link straight into ``out`` (a keyframe, or a delta over a cached base), then
            # every delta above it applied in place: no chunk-sized temporary per link, and a chain of
            # sparse deltas costs about its bytes (each link still hash-checked as it lands)
            # a keyframe read into a span buffer decodes in the room the read left around it
            room = first[3] if first is not None and len(first) == 4 and len(links) == 1 and base_data is None else None
            for i, (c, pid, e, obj) in enumerate(links):
                if len(out) != e.raw_len:
                    raise CorruptObjectError(f"chunk {c.hex()} in pack {pid}: index says {e.raw_len} bytes, "
                                             f"the manifest {len(out)}")
                self._decode_link(c, pid, e, obj, _into(out, obj, base_data, first=i == 0, room=room))
            return out
        for i, (c, pid, e, obj) in enumerate(links):
            def decode(codec: Codec, o: objects.EncodedObject = obj,
                       b: bytes | memoryview | None = base_data) -> bytes | memoryview:
                return codec.decode(o.params, o.payload, o.raw_len, b)
            result = self._decode_link(c, pid, e, obj, decode)
            if i < len(links) - 1:
                self.decoded.put(c, result)
            base_data = result
        assert base_data is not None
        return base_data

    @staticmethod
    def _decode_link(c: bytes, pid: str, e: PackEntry, obj: objects.EncodedObject,
                     run: "Callable[[Codec], bytes | memoryview]") -> bytes | memoryview:
        """Decode one link with ``run(codec)`` and check its bytes against the chunk id."""
        what = f"chunk {c.hex()} in pack {pid}"
        try:
            result = run(registry.get(obj.encoding))
        except CorruptObjectError as exc:
            raise _damaged(f"{what}: {exc}", pid, e) from None
        except (ValueError, TypeError, IndexError, OverflowError, MemoryError) as exc:
            raise _damaged(f"{what}: undecodable ({type(exc).__name__}: {exc})", pid, e) from None
        if len(result) != e.raw_len or digest(result) != c:
            raise _damaged(f"{what}: decoded bytes do not match the chunk id (data corrupted)", pid, e)
        return result

    def prepare(self, blobs: Iterable[Blob]) -> None:
        """Look up every chunk of ``blobs`` in the index at once (Index.prepare), before they are
        checked and read one by one."""
        self.index.prepare(c.chunk_id for b in blobs for c in b.chunks)

    def check_blob(self, blob: Blob) -> None:
        """Refuse a blob whose chunks the index does not back with the same lengths, before anyone
        allocates ``blob.nbytes`` (a hostile manifest may declare a terabyte over tiny chunks).
        Load runs it on every blob it reads, verify on every blob of every version."""
        for c in blob.chunks:
            self.index.entry(c.chunk_id)  # raises, naming the chunk, when it is not indexed
        why = self.blob_mismatch(blob)
        if why is not None:
            raise CorruptObjectError(why)

    def blob_mismatch(self, blob: Blob) -> str | None:
        """Why the index disagrees with the manifest about a blob's chunk lengths, or None; a chunk
        the index lacks is no mismatch here (verify reports it as missing, load via check_blob)."""
        for c in blob.chunks:
            copies = self.index.entries_for(c.chunk_id)
            if copies and copies[0][1].raw_len != c.raw_len:
                return f"chunk {c.chunk_id.hex()}: manifest says {c.raw_len} bytes, the index {copies[0][1].raw_len}"
        return None

    def read_blob(self, blob: Blob, out: memoryview | None = None, pool: "Executor | None" = None) -> memoryview:
        """Assemble a blob's bytes into ``out`` (allocated when None), reading only its chunks."""
        if out is None:
            out = memoryview(bytearray(blob.nbytes))
        return self.read_blobs_into([(blob, out)], pool)[0]

    def read_blobs_into(self, targets: "list[tuple[Blob, memoryview]]", pool: "Executor | None" = None, *,
                        live: bool = False, workers: int = 1) -> list[memoryview]:

        """Decode every chunk of several blobs into their destinations, all chunks of all blobs in
        one parallel pass (most tensors are one chunk: a pass per blob would run them one by one).
        A failure names the blob's position in ``targets`` through ``BlobReadError.index``.
        ``live``: the destinations hold a live state; a chunk they already hold is left alone,
        one a few stored deltas away is stepped there in place (:mod:`.live`).  ``workers``: the
        threads ``pool`` runs; the calling thread reads ahead of them into that many span buffers
        and SPARE_SPANS more (:mod:`.stream`)."""
        outs, jobs = _chunk_jobs(targets)
        self.index.prepare(job[1] for job in jobs)
        if live:
            jobs = self._jobs_to_read(jobs, pool)
        jobs, repeats = _first_of_each(jobs)
        tasks = self._plan_reads(jobs)
        spans = [None if t[0][2] is None else _layout(t, self._bases(t)) for t in tasks]
        parallel = pool is not None and len(tasks) > 1
        stream = SpanStream(self.store, slots=(max(workers, 1) if parallel else 1) + SPARE_SPANS, window=READ_AHEAD)
        stream.run(list(zip(tasks, spans)), spans,
                   lambda group, data: self._decode_group(group[0], group[1], data, fresh=not live),
                   pool if parallel else None, read_failed=lambda group, exc: _name_blob(group[0], exc))
        for dest, first in repeats:
            dest[:] = first
        return outs

    def _jobs_to_read(self, jobs: "list[tuple[int, bytes, memoryview]]",
                      pool: "Executor | None") -> "list[tuple[int, bytes, memoryview]]":
        """The jobs whose live destination does not already hold its chunk (or is not stepped to
        it in place by a few stored deltas)."""
        def needs_read(job: tuple[int, bytes, memoryview]) -> bool:
            try:
                return not rehydrate(self, job[1], job[2])
            except DeltackptError as exc:
                exc.blob_index = job[0]  # type: ignore[attr-defined]  # (the failure names its blob)
                raise

        need = list(pool.map(needs_read, jobs)) if pool is not None and len(jobs) > 1 else map(needs_read, jobs)
        return [job for job, n in zip(jobs, need) if n]

    def _read_job(self, job: tuple[int, bytes, memoryview], first: Fetched | None = None) -> None:
        n, cid, dest = job
        try:
            self.read_chunk(cid, dest, first)
        except DeltackptError as exc:
            exc.blob_index = n  # type: ignore[attr-defined]  # (the failure names its blob)
            raise

    def _decode_group(self, group: "list[tuple[tuple[int, bytes, memoryview], str, PackEntry]]",
                      span: "Span | None", data: memoryview | None, *, fresh: bool) -> None:
        """Decode the chunks of a group whose objects lie back to back in one pack from ``data``,
        the span buffer holding them where ``span`` placed them (None: each chunk reads its own
        copy).  ``fresh``: the destinations are new memory, faulted in a chunk at a time just
        before its decode (populate.py)."""
        if group[0][2] is None or span is None:  # nothing to plan: read_chunk finds it (or fails) on its own
            self._read_job(group[0][0])
            return
        pid = group[0][1]
        ends = [p - ROOM_HEAD for p, _n in span.pieces[1:]] + [span.size]
        in_pack = data is not None and data.readonly   # the pack's own bytes (stream.py): no room to write
        for (job, _pid, e), (pos, _n), end in zip(group, span.pieces, ends):
            if fresh:
                populate(job[2])
            first: Fetched | None = None
            if data is not None:
                if in_pack:
                    pos = e.offset - span.start
                try:
                    obj = self._check_object(pid, e, data[pos:pos + e.length])
                    if in_pack:
                        first = (pid, e, obj)
                    else:
                        start = pos + e.length - len(obj.payload)
                        first = (pid, e, obj, Room(data, start, len(obj.payload), pos - ROOM_HEAD, min(end, len(data))))
                except CorruptObjectError:
                    first = None  # a damaged header: read_chunk tries the chunk's other copies
            self._read_job(job, first)

    def _bases(self, group: list) -> tuple[tuple[str, int, int], ...]:
        """Where the deltas of a group read their bases from, down to each chain's keyframe (or a
        base decoded in memory): (pack id, offset, length) per object, for the prefetch."""
        out: list[tuple[str, int, int]] = []
        for _job, _pid, e in group:
            cur, links = e.base, 0
            while cur is not None and links < MAX_CHAIN_DEPTH and self.decoded.get(cur) is None:
                copies = self.index.entries_for(cur)
                if not copies:
                    break   # read_chunk reports it
                pid, be = copies[0]
                out.append((pid, be.offset, be.length))
                cur, links = be.base, links + 1
        return tuple(out)

    def _plan_reads(self, jobs: "list[tuple[int, bytes, memoryview]]") -> list[list]:
        """Group chunks by pack into runs of objects at most READ_GAP apart and READ_SPAN long, so
        adjacent objects are read with one request instead of one each.  Chunks already decoded
        in memory or not indexed go alone (read_chunk deals with them)."""
        placed: list = []
        tasks: list[list] = []
        for job in jobs:
            cid = job[1]
            copies = self.index.entries_for(cid) if self.decoded.get(cid) is None else []
            if copies:
                pid, e = copies[0]
                placed.append((pid, e.offset, job, e))
            else:
                tasks.append([(job, None, None)])
        placed.sort(key=lambda t: (t[0], t[1]))
        raw = 0  # decoded bytes of the last task
        for pid, _off, job, e in placed:
            if tasks and tasks[-1][0][1] == pid:  # (alone tasks have no pack id)
                head, last = tasks[-1][0][2], tasks[-1][-1][2]
                if (0 <= e.offset - (last.offset + last.length) <= READ_GAP
                        and e.offset + e.length - head.offset <= READ_SPAN and raw + e.raw_len <= READ_SPAN):
                    tasks[-1].append((job, pid, e))
                    raw += e.raw_len
                    continue
            tasks.append([(job, pid, e)])
            raw = e.raw_len
        return tasks


def _room(e: PackEntry) -> int:
    """Span buffer bytes for object ``e`` (see ROOM_HEAD), rounded to 64: a span's buffer holds
    at most its READ_SPAN decoded bytes and ROOM_HEAD + ROOM_TAIL + 64 bytes per object more."""
    return -(-(ROOM_HEAD + e.length + max(0, e.raw_len - e.length) + ROOM_TAIL) // 64) * 64


def _layout(group: list, bases: tuple[tuple[str, int, int], ...] = ()) -> Span:
    """The span a group's objects are read with, each object placed in a room of its own."""
    pieces = []
    pos = 0
    for _job, _pid, e in group:
        pieces.append((pos + ROOM_HEAD, e.length))
        pos += _room(e)
    first, last = group[0][2], group[-1][2]
    return Span(group[0][1], first.offset, last.offset + last.length - first.offset, tuple(pieces), pos, bases)


def _name_blob(group: list, exc: BaseException) -> None:
    """A failed read of a group's span names the first blob it was read for (BlobReadError.index)."""
    if isinstance(exc, DeltackptError) and getattr(exc, "blob_index", None) is None:
        exc.blob_index = group[0][0][0]  # type: ignore[attr-defined]


def _damaged(message: str, pid: str, e: PackEntry) -> CorruptObjectError:
    """A damaged copy's error, naming the copy so that a read can try the chunk's others."""
    exc = CorruptObjectError(message)
    exc.bad_copy = (pid, e.offset)  # type: ignore[attr-defined]  # (read_chunk skips this copy)
    return exc


def _into(out: memoryview, obj: objects.EncodedObject, base: bytes | memoryview | None, *, first: bool,
          room: Room | None = None) -> "Callable[[Codec], memoryview]":
    """One link decoded in ``out``: the first over ``base`` (None for a keyframe; in ``room``, the
    scratch around its payload, where its codec can), the next ones applied over what ``out`` holds."""
    def run(codec: Codec) -> memoryview:
        if first and room is not None and base is None and codec.decode_in_room(out, obj.params, room):
            return out

        if first:
            codec.decode_into(out, obj.params, obj.payload, base)
        else:
            codec.apply_into(out, obj.params, obj.payload)
        return out
    return run


def _first_of_each(jobs: "list[tuple[int, bytes, memoryview]]",
                   ) -> "tuple[list[tuple[int, bytes, memoryview]], list[tuple[memoryview, memoryview]]]":
    """The jobs of distinct chunks, and (destination, the first destination of the same chunk) for
    each repeat: a chunk stored once for several tensors (an optimizer's step counters, biases
    still at their initial value) is read and checked once and copied to the others after."""
    first: dict[bytes, memoryview] = {}
    unique: list[tuple[int, bytes, memoryview]] = []
    repeats: list[tuple[memoryview, memoryview]] = []
    for job in jobs:
        seen = first.get(job[1])
        if seen is None:
            first[job[1]] = job[2]
            unique.append(job)
        else:
            repeats.append((job[2], seen))
    return unique, repeats


def _chunk_jobs(targets: "list[tuple[Blob, memoryview]]",
                ) -> tuple[list[memoryview], list[tuple[int, bytes, memoryview]]]:
    """Each target's byte view, and one (target position, chunk id, destination slice) per chunk."""
    outs: list[memoryview] = []
    jobs: list[tuple[int, bytes, memoryview]] = []
    for n, (blob, out) in enumerate(targets):
        out = out.cast("B") if out.format != "B" else out
        if len(out) != blob.nbytes:
            raise ValueError(f"destination holds {len(out)} bytes, blob {blob.nbytes}")
        outs.append(out)
        pos = 0
        for c in blob.chunks:
            jobs.append((n, c.chunk_id, out[pos:pos + c.raw_len]))
            pos += c.raw_len
    return outs, jobs
