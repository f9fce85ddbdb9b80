"""Lazy snapshots: copy the optimizer's tensors while the next forward/backward runs.

Parameters and optimizer state change only in ``optimizer.step()``; forward and backward read
them and write gradients, which a checkpoint does not hold.  So ``save(..., blocking=False,
optimizer=opt)`` copies only the *other* tensors at call time (buffers, scheduler and scaler
tensors, RNG states: small) and returns; the tensors ``opt`` owns (its parameters and every tensor
in ``opt.state``, found by storage) are copied by :class:`LazyCopy` in the background, and a step
pre-hook on ``opt`` makes the next ``opt.step()`` wait for that copy before it writes.

CPU tensors are copied by a snapshot thread (at normal priority, see
``BackgroundOptions.lazy_copy_idle``; under
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
from typing import Any, Iterable

import torch

from .. import faults, priority, threads

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


def side_stream(streams: dict[Any, Any], device: torch.device) -> Any:
    """The side stream for lazy copies on ``device``, made once per handle (``streams``)."""
    s = streams.get(device)
    if s is None:
        s = streams[device] = torch.cuda.Stream(device=device)
    return s


class LazyCopy:
    """The deferred part of one snapshot: ``host`` copies (CPU -> staging) run on a thread of its
    own (started here, ended once the copy is done: :meth:`wait` joins it), ``cuda`` copies
    (device -> pinned host) on a side stream; ``optimizers`` wait for both before their next step.
    ``streams``: the handle's side streams by device."""

    def __init__(self, host: list[tuple[torch.Tensor, torch.Tensor]], cuda: list[tuple[torch.Tensor, torch.Tensor]],
                 optimizers: list[Any], idle: bool, copy: Any, streams: dict[Any, Any] | None = None) -> None:
        self._events: list[Any] = []
        by_device: dict[Any, list] = {}
        for dst, src in cuda:
            by_device.setdefault(src.device, []).append((dst, src))
        for device, pairs in by_device.items():
            side = side_stream(streams if streams is not None else {}, device)
            side.wait_stream(torch.cuda.current_stream(device))   # after the kernels that wrote them
            with torch.cuda.stream(side), torch.no_grad():
                for dst, src in pairs:
                    dst.copy_(src, non_blocking=True)
                    src.record_stream(side)   # the allocator must not reuse it before the copy ran
            event = torch.cuda.Event()
            event.record(side)
            self._events.append((device, event))
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._copied = threading.Event()
        self._copy_tid: int | None = None   # native id of the copying thread (boosted when waited for)
        self._waiting = False   # someone waits for the host copy: it runs at normal priority
        if host:
            self._thread = threading.Thread(target=self._run, args=(host, idle, copy), name="deltackpt-lazy",
                                            daemon=True)
            try:
                self._thread.start()
            except RuntimeError:   # the interpreter is shutting down: no new thread, copy now
                self._thread = None
                self._run(host, False, copy)
        else:
            self._copied.set()
        self._hooks: dict[int, tuple[Any, Any]] = {   # id(optimizer) -> (pre-hook, post-hook) handles
            id(opt): (opt.register_step_pre_hook(self._before_step), opt.register_step_post_hook(self._after_step))
            for opt in optimizers}
        self.nbytes = sum(d.numel() * d.element_size() for d, _ in host + cuda)
        self.step_wait_seconds = 0.0
        """Seconds optimizer steps were blocked waiting for the host copy (the lazy mode's stall)."""

    def _run(self, host: list, idle: bool, copy: Any) -> None:
        self._copy_tid = threading.get_native_id()
        threads.leave_signals_to_main()
        if idle and not self._waiting:
            priority.run_idle(True)
            if self._waiting:   # a step began waiting meanwhile: it must not wait on an idle thread
                priority.run_idle(False)
        try:
            faults.hit("snapshot.lazy_copy")   # tests widen the window here (sleepX)
            copy(host)
        except BaseException as exc:  # noqa: BLE001 - raised by whoever waits (the save, wait_snapshot)
            self._error = exc
        finally:
            priority.run_idle(False)
            self._copied.set()

    def host_done(self) -> bool:
        return self._copied.is_set()

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
        if not self._copied.is_set():
            self._waiting = True
            if self._copy_tid is not None:
                priority.boost_thread(self._copy_tid)   # someone waits: the copy must not yield any more
            self._copied.wait()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()   # it ends right after the copy: nothing of it outlives this wait
        if self._error is not None:
            raise self._error

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
