"""The snapshot copy of a background save: device -> pinned host copies queued on the CUDA
stream, host copies cut across threads.

:func:`copy_host` runs on the caller's thread and a helper thread per core torch's threads leave
free (joined before it returns), a large contiguous tensor cut into slices.
:func:`copy_and_fence` runs a snapshot's copies and returns what fences the device ones.
"""

from __future__ import annotations

import os
import threading

import torch

from .. import threads as worker_threads

PARALLEL_COPY_BYTES = 16 << 20
"""A snapshot at least this large is copied by several threads (:func:`copy_threads`) when the
machine has cores the training loop's torch threads leave free.  Memory-bound, but two threads
measured 20-30% faster than one on the 2-vCPU project machine (271 MB: 43 ms -> 31-38 ms), and the
stall is the one part of a background save the loop waits for.  The other cores are idle then:
the previous save has finished."""

MAX_COPY_THREADS = 4
"""Threads that copy one snapshot at most (memory bandwidth is saturated well before more)."""


def _copy_list(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():   # thread-local (flatten detaches leaves; this keeps any other caller safe)
        for dst, src in pairs:
            dst.copy_(src)


def copy_threads() -> int:
    """Threads for a host copy: the caller plus a helper for each core torch's intra-op threads
    leave free (``copy_`` itself already runs on torch's threads), at most MAX_COPY_THREADS."""
    return max(1, min(MAX_COPY_THREADS, 1 + (os.cpu_count() or 1) - torch.get_num_threads()))


def _split(pairs: list[tuple[torch.Tensor, torch.Tensor]], parts: int) -> list[list]:
    """Cut ``pairs`` into ``parts`` lists of about equal bytes; a contiguous tensor larger than
    a share is cut into flat slices, so one big tensor is copied by several threads too."""
    total = sum(d.numel() * d.element_size() for d, _ in pairs)
    share = max(1, -(-total // parts))
    out: list[list] = [[]]
    room = share
    for dst, src in pairs:
        size = dst.numel() * dst.element_size()
        if size <= room or not (src.is_contiguous() and dst.is_contiguous() and src.dtype == dst.dtype):
            out[-1].append((dst, src))
            room -= size
        else:
            flat_d, flat_s, n, pos = dst.view(-1), src.view(-1), dst.numel(), 0
            while pos < n:
                take = min(n - pos, max(1, room // dst.element_size()))
                out[-1].append((flat_d[pos:pos + take], flat_s[pos:pos + take]))
                pos += take
                room -= take * dst.element_size()
                if room <= 0 and pos < n:
                    out.append([])
                    room = share
        if room <= 0:
            out.append([])
            room = share
    return [p for p in out if p]


def copy_host(pairs: list[tuple[torch.Tensor, torch.Tensor]], threads: int | None = None) -> None:
    """Copy host ``pairs`` with ``threads`` threads (default :func:`copy_threads`: the caller is
    blocked, so every core torch leaves free) when they are at least PARALLEL_COPY_BYTES; the
    caller's thread takes the first share, helper threads (started here, joined before this
    returns) the others."""
    total = sum(dst.numel() * dst.element_size() for dst, _ in pairs)
    parts = min(MAX_COPY_THREADS, threads or copy_threads())
    if total < PARALLEL_COPY_BYTES or parts < 2:
        _copy_list(pairs)
        return
    shares = _split(pairs, parts)
    if len(shares) < 2:
        _copy_list(pairs)
        return
    errors: list[BaseException] = []

    def helper(share: list) -> None:
        # the snapshot is the caller's stall: never at idle priority (see materialize.read_pool)
        worker_threads.start_worker(False)
        try:
            _copy_list(share)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            errors.append(exc)

    helpers = [threading.Thread(target=helper, args=(share,), name="deltackpt-snapshot", daemon=True)
               for share in shares[1:]]
    try:
        for t in helpers:
            t.start()
    except RuntimeError:   # the interpreter is shutting down: no new thread, copy here
        for t, share in zip(helpers, shares[1:]):
            if not t.is_alive() and t.ident is None:
                _copy_list(share)
    _copy_list(shares[0])
    for t in helpers:
        if t.ident is not None:
            t.join()
    if errors:
        raise errors[0]


class _Fence:
    """Events recorded after device -> host copies, one per device's current stream."""

    def __init__(self, events: list) -> None:
        self.events = events

    def synchronize(self) -> None:
        for e in self.events:
            e.synchronize()


def copy_and_fence(copies: list[tuple[torch.Tensor, torch.Tensor, bool]]) -> "_Fence | None":
    """Run ``copies`` now: device -> pinned host ones queued on their device's current CUDA stream
    (returns what fences them, or None), host ones with :func:`copy_host`."""
    devices = []
    with torch.no_grad():
        for dst, src, pin in copies:
            if pin:
                dst.copy_(src, non_blocking=True)
                if src.device not in devices:
                    devices.append(src.device)
    events = []
    for device in devices:
        e = torch.cuda.Event()
        e.record(torch.cuda.current_stream(device))
        events.append(e)
    copy_host([(dst, src) for dst, src, pin in copies if not pin])
    return _Fence(events) if events else None
