"""Rollback drills: restore a version into fresh memory as a restarted process would, prove it
bit-identical against the manifest's chunk hashes, and measure what that cost.

A drill opens the repository afresh over a byte-counting view of its store (no index, manifest or
decoded chunk in memory), resolves the revision, reads every blob into new buffers, then hashes
every chunk of them again, independently of the reader's own checks.  The result is recorded as a
``drill`` event (:mod:`.events`): ``deltackpt log`` and ``show`` display the last one, and
interval policies that need a restart cost (``YoungDaly``) take its measured time.

Blobs are read in batches of at most ``BATCH_BYTES``, so a drill of a large state never holds
more than that in memory besides the largest blob.

Example::

    report = run_drill(core, "latest~1")
    print(report.ok, report.seconds, report.bytes_read)
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from ... import priority
from ... import threads as worker_threads
from ...errors import CorruptObjectError, DeltackptError
from ...format.events import DRILL
from ...format.ids import digest
from ...format.limits import EVENT_MAX_TEXT
from ...format.manifest import Blob
from ...store.counting import ReadMeter
from ..repository import Repository
from . import events

BATCH_BYTES = 256 << 20


@dataclass
class DrillReport:
    """What one drill found: ``ok`` (every chunk restored and matched its hash), the restore's wall
    and CPU seconds, the bytes it read (config, index, manifest and objects) and the version's
    logical bytes and chunk count; ``event`` is the id of the record written (None: not recorded)."""

    version: str
    revision: str
    ok: bool
    seconds: float
    cpu_seconds: float
    bytes_read: int
    logical_bytes: int
    chunks: int
    error: str | None = None
    event: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def record(self) -> dict[str, Any]:
        """The event record's fields (spec/FORMAT.md, "Event records")."""
        return {**events.stamp(DRILL), "version": self.version, "seconds": self.seconds,
                "bytes_read": self.bytes_read, "revision": self.revision[:EVENT_MAX_TEXT], "ok": self.ok,
                "logical_bytes": self.logical_bytes, "chunks": self.chunks, "cpu_seconds": self.cpu_seconds,
                "error": None if self.error is None else self.error[:EVENT_MAX_TEXT]}


def _batches(blobs: list[Blob]) -> list[list[Blob]]:
    out: list[list[Blob]] = [[]]
    size = 0
    for b in blobs:
        if out[-1] and size + b.nbytes > BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(b)
        size += b.nbytes
    return out


def _restore_and_check(fresh: Repository, blobs: list[Blob], pool: ThreadPoolExecutor | None, threads: int = 1) -> None:
    """Read every blob into new memory and hash each chunk of it again."""
    fresh.chunks.prepare(blobs)
    for batch in _batches(blobs):
        for b in batch:
            fresh.chunks.check_blob(b)
        buffers = [memoryview(bytearray(b.nbytes)) for b in batch]
        fresh.chunks.read_blobs_into(list(zip(batch, buffers)), pool, workers=threads)
        for b, buf in zip(batch, buffers):
            pos = 0
            for c in b.chunks:
                if digest(buf[pos:pos + c.raw_len]) != c.chunk_id:
                    raise CorruptObjectError(f"chunk {c.chunk_id.hex()}: restored bytes do not match its hash")
                pos += c.raw_len


def run_drill(core: Repository, revision: str = "latest", *, threads: int = 1, idle: bool = False,
              record: bool = True, label: str | None = None) -> DrillReport:
    """Drill ``revision`` of ``core``'s repository; record the result unless ``record=False``.

    ``threads``: decode threads (1 reads in the calling thread).  ``idle``: run under SCHED_IDLE
    (a drill beside a training loop must never slow it; its wall time then says how long the
    restore took on the cores left over, its CPU time what it costs alone).  A revision that does
    not resolve raises; a version that does not restore is a failed drill (``ok`` False,
    ``error`` naming the chunk), recorded like any other.  ``label``: the revision text recorded
    (a caller that resolved ``latest`` itself, to hold that version, still records ``latest``)."""
    meter = ReadMeter(core.store)
    vid, blobs, error = revision, [], None
    pool = None
    if threads > 1:
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="deltackpt-drill",
                                  initializer=worker_threads.start_worker, initargs=(idle,))
    priority.run_idle(idle)
    # CPU of this thread alone when it does all the work (a training loop runs beside it), else of
    # the process (the CLI: nothing else runs)
    cpu_clock = time.thread_time if pool is None else time.process_time
    t0, c0 = time.perf_counter(), cpu_clock()
    try:
        fresh = Repository(meter)       # what a restarted process opens: nothing in memory yet
        vid = fresh.resolve(revision)
        blobs = fresh.manifest(vid).blobs
        try:
            _restore_and_check(fresh, blobs, pool, threads)
        except DeltackptError as exc:
            error = f"{type(exc).__name__}: {exc}"
    finally:
        seconds, cpu = time.perf_counter() - t0, cpu_clock() - c0
        if idle:
            priority.run_idle(False)
        if pool is not None:
            pool.shutdown(wait=True)
    report = DrillReport(vid, label or revision, error is None, seconds, cpu, meter.bytes_read,
                         sum(b.nbytes for b in blobs), sum(len(b.chunks) for b in blobs), error)
    if record:
        report.event = events.write(core, report.record())
    return report
