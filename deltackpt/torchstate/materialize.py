"""Manifest entries -> tensors: read only the blobs asked for, rebuild storage sharing."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterable, Iterator

import numpy as np
import torch

from .. import threads as worker_threads
from ..errors import CorruptObjectError, DeltackptError, InvalidArgumentError, OutOfMemoryError
from ..format.manifest import Manifest, TensorEntry
from ..repo.repository import Repository
from .dtypes import dtype_of
from .flatten import contiguous_strides
from .tensor_bytes import from_bytes

THREADS_ENV = "DELTACKPT_READ_THREADS"


def read_threads(threads: int | None = None) -> int:
    """Decode threads for a read: ``threads``, else ``$DELTACKPT_READ_THREADS``, else every core
    this process may run on (decoding is numpy and zstd, which release the GIL)."""
    if threads is None:
        text = os.environ.get(THREADS_ENV, "").strip()
        if not text:
            try:
                return max(1, len(os.sched_getaffinity(0)))
            except (AttributeError, OSError):  # macOS, Windows
                return max(1, os.cpu_count() or 1)
        try:
            threads = int(text)
        except ValueError:
            raise InvalidArgumentError(f"{THREADS_ENV}={text!r:.40} is not a whole number of threads") from None
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 1024:
        raise InvalidArgumentError(f"threads must be a whole number from 1 to 1024, got {threads!r:.40}")
    return threads


def _new_pool(n: int) -> ThreadPoolExecutor:
    # reads serve a caller that waits: never at idle priority, even if first asked for from a
    # background save's thread (whose policy new threads would inherit)
    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="deltackpt-read",
                              initializer=worker_threads.start_worker, initargs=(False,))


@contextmanager
def pool(threads: int | None = None) -> Iterator[ThreadPoolExecutor]:
    """A read pool of ``threads`` (default :func:`read_threads`) for the duration of one read,
    shut down when it ends: no ``deltackpt-read`` thread outlives a load (frameworks check for
    leftover threads after a run; a few thread starts per load cost nothing next to decoding)."""
    own = _new_pool(read_threads(threads))
    try:
        yield own
    finally:
        own.shutdown(wait=True)   # every task has finished: its idle workers exit at once


def is_own_blob(m: Manifest, e: TensorEntry) -> bool:
    """True when the tensor is the whole of its blob, contiguous (no sharing to rebuild)."""
    return e.offset == 0 and m.blobs[e.blob].nbytes == e.nbytes and (
        e.numel == 0 or e.stride == contiguous_strides(e.shape))


def names_of_blob(m: Manifest, b: int) -> str:
    """The first few tensor names stored in blob ``b`` (for error messages)."""
    return ", ".join([t.name for t in m.tensors if t.blob == b][:3])


def check_blob_of(core: Repository, vid: str, m: Manifest, b: int) -> None:
    """Blob ``b``'s sizes are backed by the index (before anything is allocated or read), else a
    CorruptObjectError naming the version and tensor."""
    try:
        core.chunks.check_blob(m.blobs[b])  # sizes backed by the index before anything is allocated or read
    except CorruptObjectError as exc:
        raise CorruptObjectError(f"version {vid[:10]}, tensor {names_of_blob(m, b)}: {exc}") from None


# A read of at most this many bytes decodes on the calling thread: starting a pool and handing it
# each span costs more than the decoding it would overlap (a 4 MB CNN + AdamW state, repeated
# warm loads: 5.4-5.9 ms inline, 7.3-13.5 ms through a pool; bench/RESTART.md, stop 44).
INLINE_LOAD_BYTES = 8 << 20


def read_into(core: Repository, vid: str, m: Manifest, targets: "list[tuple[int, memoryview]]", *,
              checked: bool = False, live: bool = False, threads: int | None = None) -> None:
    """Decode blobs (by index) into destinations, every chunk of every blob in one parallel pass;
    errors name the version and tensor.  ``checked``: the caller already ran check_blob.
    ``live``: the destinations are live tensors; chunks they hold (or are a few deltas from) are
    kept or stepped in place (:mod:`deltackpt.repo.read.live`).  ``threads``: see :func:`read_threads`
    (a read of at most INLINE_LOAD_BYTES uses none but the caller's)."""
    if not checked:
        core.chunks.prepare([m.blobs[b] for b, _ in targets])
        for b, _ in targets:
            check_blob_of(core, vid, m, b)
    count = read_threads(threads)
    jobs = [(m.blobs[b], out) for b, out in targets]
    try:
        if sum(blob.nbytes for blob, _ in jobs) <= INLINE_LOAD_BYTES:
            core.chunks.read_blobs_into(jobs, None, live=live)
        else:
            with pool(count) as workers:
                core.chunks.read_blobs_into(jobs, workers, live=live, workers=count)
    except DeltackptError as exc:
        n = getattr(exc, "blob_index", None)
        where = f"tensor {names_of_blob(m, targets[n][0])}" if n is not None else "a tensor"
        raise type(exc)(f"version {vid[:10]}, {where}: {exc}") from None


# Blobs smaller than this share buffers of about this size: a few thousand small tensors cost a
# few allocations, not one each.  The price: a tensor kept alive keeps its whole buffer (at most
# ARENA_BYTES).
ARENA_BYTES = 8 << 20
_ALIGN = 64


def _fresh(n: int) -> np.ndarray:
    """``n`` uninitialized bytes from torch's allocator, as a uint8 array (the tensors built over it
    keep it alive), in small pages as ``torch.load``'s.  Not numpy's: numpy asks for transparent
    huge pages on large buffers, and where the kernel lacks free 2 MiB blocks it compacts memory
    on the fault (the kernel's THP defrag setting, ``madvise``): a 1.5 GB load took 2.3-2.9 s of
    system time in huge pages against 0.8-1.0 s in small ones on the project machine.  Huge pages
    won where they were free (a 260 MB load: ~0.1 s against ~0.17 s), but never by that much."""
    return torch.empty(n, dtype=torch.uint8).numpy()


def _buffers(sizes: dict[int, int]) -> dict[int, np.ndarray]:
    """An uninitialized uint8 array per blob (every byte is decoded into it); small blobs are
    64-byte-aligned slices of shared ARENA_BYTES buffers, in blob order."""
    out: dict[int, np.ndarray] = {}
    group: list[tuple[int, int]] = []
    used = 0

    def flush() -> None:
        nonlocal used
        if group:
            arena = _fresh(used + _ALIGN)
            pos = -arena.ctypes.data % _ALIGN
            for b, n in group:
                out[b] = arena[pos:pos + n]
                pos += -(-n // _ALIGN) * _ALIGN
            group.clear()
            used = 0

    for b, n in sizes.items():
        if n >= ARENA_BYTES // 2:
            out[b] = _fresh(n)
            continue
        padded = -(-n // _ALIGN) * _ALIGN
        if used + padded > ARENA_BYTES:
            flush()
        group.append((b, n))
        used += padded
    flush()
    return out


def read_blobs(core: Repository, vid: str, m: Manifest, blob_ids: Iterable[int], *,
               threads: int | None = None, seeds: "dict[int, np.ndarray] | None" = None) -> dict[int, np.ndarray]:
    """Fresh buffers holding the blobs.  ``seeds``: blob -> the bytes a live tensor holds now (a
    nearby version): copied in first, then kept or stepped where their hash proves them, as
    :func:`deltackpt.restore` does in place, so only what differs is read; the live tensors are
    not written."""
    wanted = sorted(set(blob_ids))
    core.chunks.prepare([m.blobs[b] for b in wanted])
    for b in wanted:
        check_blob_of(core, vid, m, b)
    try:
        out = _buffers({b: m.blobs[b].nbytes for b in wanted})
    except (MemoryError, ValueError):
        total = sum(m.blobs[b].nbytes for b in wanted)
        raise OutOfMemoryError(f"version {vid[:10]}: cannot allocate {total} bytes for "
                               f"{len(wanted)} tensors (e.g. {names_of_blob(m, wanted[-1])}); load fewer layers or "
                               "restore into an existing model") from None
    given = seeds or {}
    seeded = {b for b, src in given.items() if b in out and len(src) == len(out[b])}
    for b in seeded:
        np.copyto(out[b], given[b])
    for live in (True, False):
        targets = [(b, buf.data) for b, buf in out.items() if (b in seeded) == live]
        if targets:
            read_into(core, vid, m, targets, checked=True, live=live, threads=threads)
    return out


def build_tensors(m: Manifest, indices: Iterable[int], buffers: "dict[int, np.ndarray] | dict[int, torch.Tensor]",
                  device: torch.device | str | None = None) -> dict[int, torch.Tensor]:
    """Tensors for ``indices`` over the blobs' bytes (host arrays, or flat uint8 tensors on a
    device); tensors sharing a blob share one storage (moved to ``device`` once)."""
    storages: dict[int, torch.Tensor] = {}
    out: dict[int, torch.Tensor] = {}
    for i in indices:
        e = m.tensors[i]
        dtype = dtype_of(e.dtype, e.name)
        buf = buffers[e.blob]
        if is_own_blob(m, e):
            t = from_bytes(buf, dtype, e.shape)
            out[i] = t.to(device) if device is not None and torch.device(device) != t.device else t
            continue
        if e.blob not in storages:
            base = buf if isinstance(buf, torch.Tensor) else torch.from_numpy(buf)
            if device is not None and torch.device(device) != base.device:
                base = base.to(device)
            storages[e.blob] = base
        base = storages[e.blob]
        isz = torch.empty(0, dtype=dtype).element_size()
        t = torch.empty(0, dtype=dtype, device=base.device)
        t.set_(base.untyped_storage(), e.offset // isz, e.shape, e.stride)
        out[i] = t
    return out
