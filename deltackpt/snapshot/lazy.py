"""Lazy snapshots: copy the optimizer's tensors while the next forward/backward runs.

Parameters and optimizer state change only in ``optimizer.step()``; forward and backward read
them and write gradients, which a checkpoint does not hold.  So ``save(..., blocking=False,
optimizer=opt)`` copies only the *other* tensors at call time (buffers, scheduler and scaler
tensors, RNG states: small) and returns; the tensors ``opt`` owns (its parameters and every tensor
in ``opt.state``, found by storage) are copied by :class:`LazyCopy` in the background, and a step
pre-hook on ``opt`` makes the next ``opt.step()`` wait for that copy before it writes.

CPU tensors are copied by a snapshot thread (at normal priority, see :data:`COPY_IDLE`; under
``SCHED_IDLE`` it is put back to normal as soon as the optimizer has to wait).  CUDA tensors are copied into
pinned host buffers on a side stream that first waits for the current stream (the last step's
kernels); the hook then makes the optimizer's stream wait on the copy's CUDA event, so the GPU
orders the two and the CPU does not block.

Safe without waiting: forward, backward, ``zero_grad``, gradient clipping,
``scaler.scale``/``unscale_``/``step``/``update`` (a skipped step too), ``scheduler.step()``,
replacing tensors (``model.half()``, ``optimizer.load_state_dict``: the old storage is what is
copied), more saves; a wrapper whose ``state_dict()`` clones is simply not lazy.

What this does not see is the user's to declare (see :func:`deltackpt.save`): any in-place write
to a parameter or optimizer-state tensor outside ``opt.step()`` (``model.load_state_dict``, EMA or
weight-averaging updates into the live parameters, ``with torch.no_grad(): p.mul_(...)``, a second
optimizer over the same parameters that was not passed) must come after
``handle.wait_snapshot()``.  :func:`deltackpt.restore`, which writes into live parameters, waits
for every pending copy by itself.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable

import torch

from .. import faults, priority, threads
from ..errors import UnsupportedLeafError

COPY_IDLE = False
"""Run the lazy copy under SCHED_IDLE (when background saves do).  Off: an idle thread that holds
the GIL between copies can be starved by torch's threads while the loop waits for the GIL (seen
with the pre-fault thread, :data:`.prefault.PREFAULT_IDLE`).  At idle, bench/async_stall.py
(minilm-full, every 9 steps, 4 paired rounds) gave the lazy mode +4.2% [+1.4, +8.4] against +1.9%
[+1.0, +3.0] for the plain thread save; at normal priority (12 rounds each, bench/ASYNC.md stop 16)
lazy and plain were within each other's intervals on minilm-full (+2.8% [+0.8, +5.1] vs +3.2%
[+1.4, +5.2], every 10 steps) and on the 268 MB large-tensor state."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_streams: dict[Any, Any] = {}        # CUDA device -> side stream for lazy copies
_copy_tid: int | None = None         # native id of the lazy copy thread (boosted when waited for)


def optimizers_of(optimizer: Any) -> list[Any]:
    """``optimizer`` as a list of optimizers (one, a list or tuple); anything without step hooks is
    refused with :class:`~deltackpt.errors.UnsupportedLeafError` before anything is written."""
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for opt in opts:
        if not all(hasattr(opt, a) for a in ("register_step_pre_hook", "register_step_post_hook", "param_groups", "state")):
            raise UnsupportedLeafError(f"optimizer: expected a torch.optim.Optimizer (or a list of them), "
                                       f"got {type(opt).__name__}")
    return opts


def storage_key(t: torch.Tensor) -> tuple | None:
    """What identifies ``t``'s storage while it lives (None for an empty storage)."""
    s = t.untyped_storage()
    return (t.device, s.data_ptr()) if s.nbytes() else None


def owned_storages(optimizers: Iterable[Any]) -> set[tuple]:
    """Storages only ``optimizer.step()`` writes: every parameter and every tensor in the state."""
    keys: set[tuple] = set()

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            k = storage_key(t)
            if k is not None:
                keys.add(k)

    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                add(p)
        for per_param in opt.state.values():
            if isinstance(per_param, dict):
                for v in per_param.values():
                    add(v)
    return keys


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltackpt-lazy")
        return _pool


def _side_stream(device: torch.device) -> Any:
    s = _streams.get(device)
    if s is None:
        s = _streams[device] = torch.cuda.Stream(device=device)
    return s


class LazyCopy:
    """The deferred part of one snapshot: ``host`` copies (CPU -> staging) run on a snapshot
    thread, ``cuda`` copies (device -> pinned host) on a side stream; ``optimizers`` wait for both
    before their next step."""

    def __init__(self, host: list[tuple[torch.Tensor, torch.Tensor]], cuda: list[tuple[torch.Tensor, torch.Tensor]],
                 optimizers: list[Any], idle: bool, copy: Any) -> None:
        self._events: list[Any] = []
        by_device: dict[Any, list] = {}
        for dst, src in cuda:
            by_device.setdefault(src.device, []).append((dst, src))
        for device, pairs in by_device.items():
            side = _side_stream(device)
            side.wait_stream(torch.cuda.current_stream(device))   # after the kernels that wrote them
            with torch.cuda.stream(side), torch.no_grad():
                for dst, src in pairs:
                    dst.copy_(src, non_blocking=True)
                    src.record_stream(side)   # the allocator must not reuse it before the copy ran
            event = torch.cuda.Event()
            event.record(side)
            self._events.append((device, event))
        self._future: Future[None] | None = None
        self._waiting = False   # someone waits for the host copy: it runs at normal priority
        if host:
            self._future = _executor().submit(self._run, host, idle, copy)
        self._hooks: dict[int, tuple[Any, Any]] = {   # id(optimizer) -> (pre-hook, post-hook) handles
            id(opt): (opt.register_step_pre_hook(self._before_step), opt.register_step_post_hook(self._after_step))
            for opt in optimizers}
        self.nbytes = sum(d.numel() * d.element_size() for d, _ in host + cuda)
        self.step_wait_seconds = 0.0
        """Seconds optimizer steps were blocked waiting for the host copy (the lazy mode's stall)."""

    def _run(self, host: list, idle: bool, copy: Any) -> None:
        global _copy_tid
        _copy_tid = threading.get_native_id()
        threads.leave_signals_to_main()
        if idle and not self._waiting:
            priority.run_idle(True)
            if self._waiting:   # a step began waiting meanwhile: it must not wait on an idle thread
                priority.run_idle(False)
        try:
            faults.hit("snapshot.lazy_copy")   # tests widen the window here (sleepX)
            copy(host)
        finally:
            priority.run_idle(False)

    def host_done(self) -> bool:
        return self._future is None or self._future.done()

    def done(self) -> bool:
        """True once every copy has finished (the optimizer may write without waiting)."""
        return self.host_done() and all(e.query() for _, e in self._events)

    def wait(self) -> None:
        """Block until the copies are in host memory (the background save's thread, and
        :meth:`SaveHandle.wait_snapshot`); re-raise a copy's error."""
        self._wait_host()
        for _, e in self._events:
            e.synchronize()

    def _wait_host(self) -> None:
        if self._future is None:
            return
        if not self._future.done():
            self._waiting = True
            if _copy_tid is not None:
                priority.boost_thread(_copy_tid)   # someone waits: the copy must not yield any more
        self._future.result()

    def _before_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self.host_done():
            t0 = time.perf_counter()
            try:
                self._wait_host()
            except BaseException:  # noqa: BLE001 - the save reports the copy's error; training goes on
                pass
            self.step_wait_seconds += time.perf_counter() - t0
        for device, e in self._events:
            torch.cuda.current_stream(device).wait_event(e)   # GPU-side order, the CPU does not block

    def _after_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        # this optimizer has waited: its pre-hook may go (pre-hooks are not being iterated now);
        # the post-hook itself goes at the next remove_hooks.  Other optimizers keep theirs: on
        # CUDA only their own stream's wait orders them after the copy.
        hooks = self._hooks.get(id(opt))
        if hooks is not None:
            hooks[0].remove()

    def remove_hooks(self) -> None:
        """Unregister from the optimizers once the copy is done (call between steps, from the
        training thread: the next lazy save and ``wait_snapshot`` do)."""
        if not self.done():
            return
        for pre, post in self._hooks.values():
            pre.remove()
            post.remove()
        self._hooks = {}
