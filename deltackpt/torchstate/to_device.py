"""Blobs decoded straight into device memory (a GPU): each decode thread takes its own windows
of chunks, decodes one into a pinned host buffer of its own while the previous one's bytes cross
to the device, so a restore onto a GPU holds two small buffers per thread, not a host copy of the
state; the threads never wait for each other, and the copy engine works while the cores decode."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import wait
from typing import Iterable, Iterator

import torch

from ..errors import DeltackptError, OutOfMemoryError
from ..format.manifest import Blob, Manifest
from ..repo.repository import Repository
from .materialize import check_blob_of, names_of_blob, pool, read_threads
from .tensor_bytes import bits_of

#: host bytes a thread decodes before its copy to the device starts (a few chunks): two such
#: buffers per thread are all the host memory a restore onto a device holds
WINDOW_BYTES = 8 << 20

# (target position, whole chunks of its blob, where they go in the destination's bytes)
_Piece = tuple[int, Blob, torch.Tensor]


def _pieces(n: int, blob: Blob, flat: torch.Tensor, window: int) -> Iterator[_Piece]:
    """Runs of whole chunks of ``blob`` of at most ``window`` bytes (one chunk at least)."""
    start = size = 0
    group: list = []
    for c in blob.chunks:
        if group and size + c.raw_len > window:
            yield n, Blob(size, blob.itemsize, blob.row_bytes, group), flat[start:start + size]
            start, size, group = start + size, 0, []
        group.append(c)
        size += c.raw_len
    if group:
        yield n, Blob(size, blob.itemsize, blob.row_bytes, group), flat[start:start + size]


def _windows(pieces: Iterator[_Piece], window: int) -> list[list[_Piece]]:
    out: list[list[_Piece]] = []
    size = window
    for p in pieces:
        if size + p[1].nbytes > window:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p[1].nbytes
    return out


def copy_blobs_to_device(core: Repository, vid: str, m: Manifest, targets: "list[tuple[int, torch.Tensor]]", *,
                         threads: int | None = None, pin: bool | None = None, window: int | None = None,
                         checked: bool = False) -> None:
    """Decode blobs (by index) of version ``vid`` into contiguous tensors, on a GPU or anywhere.

    The chunks are cut into windows of about ``window`` bytes (default :data:`WINDOW_BYTES`):
    whole chunks, of several tensors or part of a larger one, dealt out to ``threads`` threads
    (see :func:`read_threads`).  Each
    thread decodes a window into one of its two host buffers (pinned when CUDA is available) and
    copies it to its destinations on a stream of its own, then decodes its next window into the
    other buffer.  Returns once every byte is in place (the caller's stream is ordered after the
    copies).  Sizes are checked against the index before anything is written (``checked``: the
    caller did); a failure names the version and tensor, once every thread has stopped.

    Example::

        dst = torch.empty(e.numel, dtype=torch.float32, device="cuda")
        copy_blobs_to_device(core, vid, m, [(e.blob, dst)])
    """
    flats = []
    for b, dst in targets:
        if not dst.is_contiguous():
            raise ValueError(f"tensor {names_of_blob(m, b)}: the destination is not contiguous")
        flat = bits_of(dst.detach()).reshape(-1).view(torch.uint8)
        if flat.numel() != m.blobs[b].nbytes:
            raise ValueError(f"destination holds {flat.numel()} bytes, blob {m.blobs[b].nbytes}")
        flats.append(flat)
    if not checked:
        core.chunks.prepare([m.blobs[b] for b, _ in targets])
        for b, _ in targets:
            check_blob_of(core, vid, m, b)
    size = WINDOW_BYTES if window is None else window
    pieces = (p for n, (b, _) in enumerate(targets) for p in _pieces(n, m.blobs[b], flats[n], size))
    windows = _windows(pieces, size)
    if not windows:
        return
    count = min(read_threads(threads), len(windows))
    pin = torch.cuda.is_available() if pin is None else pin
    callers = {f.device: torch.cuda.current_stream(f.device) for f in flats if f.device.type == "cuda"}
    stop = threading.Event()

    def lane(j: int) -> None:
        try:
            _lane(core, windows[j::count], callers, pin, stop)
        except DeltackptError as exc:
            stop.set()
            i = getattr(exc, "blob_index", None)
            where = f"tensor {names_of_blob(m, targets[i][0])}" if i is not None else "a tensor"
            raise type(exc)(f"version {vid[:10]}, {where}: {exc}") from None
        except BaseException:
            stop.set()
            raise

    with pool(count) as workers:
        futures = [workers.submit(lane, j) for j in range(count)]
        wait(futures)
    for f in futures:
        f.result()   # the first failure, once every thread has stopped


def _lane(core: Repository, windows: list[list[_Piece]], callers: dict, pin: bool, stop: threading.Event) -> None:
    """One thread's windows, in order, through its two host buffers and its own streams."""
    size = max(sum(p[1].nbytes for p in w) for w in windows)
    stages = [torch.empty(size, dtype=torch.uint8, pin_memory=pin) for _ in range(min(2, len(windows)))]
    done: list[list] = [[] for _ in stages]
    streams: dict = {}
    try:
        for k, win in enumerate(windows):
            if stop.is_set():
                return
            s = k % len(stages)
            for event in done[s]:
                event.synchronize()   # the bytes last decoded into this buffer have left it
            stage, host = stages[s], stages[s].numpy()
            jobs, pos = [], 0
            for _, piece, _ in win:
                jobs.append((piece, host[pos:pos + piece.nbytes].data))
                pos += piece.nbytes
            try:
                core.chunks.read_blobs_into(jobs)
            except DeltackptError as exc:
                i = getattr(exc, "blob_index", None)
                exc.blob_index = win[i][0] if i is not None else None  # type: ignore[attr-defined]
                raise
            pos = 0
            for _, piece, dst in win:
                side = _stream(streams, callers, dst.device)
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                    dst.copy_(stage[pos:pos + piece.nbytes], non_blocking=side is not None)
                pos += piece.nbytes
            done[s] = [st.record_event() for st in streams.values()]
    finally:
        for st in streams.values():
            st.synchronize()   # nothing in flight once this returns, even on an error
            callers[st.device].wait_stream(st)


def _stream(streams: dict, callers: dict, device: torch.device) -> "torch.cuda.Stream | None":
    """This thread's side stream on ``device`` (None off CUDA), ordered after the caller's work."""
    if device.type != "cuda":
        return None
    if device not in streams:
        streams[device] = torch.cuda.Stream(device=device)
        streams[device].wait_stream(callers[device])   # after whatever allocated or wrote the destinations
    return streams[device]


def read_blobs_to_device(core: Repository, vid: str, m: Manifest, blob_ids: Iterable[int],
                         device: "torch.device | str", *, threads: int | None = None) -> dict[int, torch.Tensor]:
    """Fresh flat uint8 tensors on ``device`` holding the blobs (for :func:`build_tensors`):
    the device's memory is written once, and the host holds two windows, not the state."""
    wanted = sorted(set(blob_ids))
    core.chunks.prepare([m.blobs[b] for b in wanted])
    for b in wanted:
        check_blob_of(core, vid, m, b)   # before the device memory is taken
    try:
        out = {b: torch.empty(m.blobs[b].nbytes, dtype=torch.uint8, device=device) for b in wanted}
    except (torch.OutOfMemoryError, MemoryError):
        total = sum(m.blobs[b].nbytes for b in wanted)
        raise OutOfMemoryError(f"version {vid[:10]}: cannot allocate {total} bytes on {device} for {len(wanted)} "
                               f"tensors (e.g. {names_of_blob(m, wanted[-1])}); load fewer layers or "
                               "restore into an existing model") from None
    copy_blobs_to_device(core, vid, m, list(out.items()), threads=threads, checked=True)
    return out
