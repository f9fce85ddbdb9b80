"""Who encodes a save's chunks: a pool of encoder threads, or, for a small state, the thread that
writes the save (:func:`encoder_threads` decides; :class:`EncoderPool` runs it).

Example::

    with EncoderPool(encoder_threads(state_bytes, workers=None)) as pool:
        future = pool.submit(encode, chunk)
        result = future.result()
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from ... import threads


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


INLINE_STATE_BYTES = 6 << 20
"""A save of fewer bytes than this encodes its chunks on the thread that writes it, whatever
``workers`` says.  Why: starting a pool's threads and passing the interpreter lock between them
costs more than a second thread saves on a few MB of encoding.  Measured on the 2-core machine
(stop 52, CPU per save, medians): a 3.8 MiB CNN with SGD momentum 25-36 -> 16-24 ms, its page faults
~1,000 -> ~12 a save (the pool threads' malloc arenas hand their freed pages back after every
save); a 4 MB MLP 20-28 -> 19-26 ms; at 8 MB the CPU ties and the wall grows 10-20% (28-31 -> 32-34
ms); at 16 MB the pool wins (wall 37 ms against 50-54)."""


def encoder_threads(state_bytes: int, workers: int | None) -> int:
    """The encoder threads a save of ``state_bytes`` starts: none under :data:`INLINE_STATE_BYTES`
    (the writing thread encodes), else ``workers``, by default :func:`default_workers`."""
    if state_bytes < INLINE_STATE_BYTES:
        return 0
    return workers or default_workers()


class EncoderPool:
    """The chunk encoders' threads; inline in the caller's thread when there are none
    (``workers`` 0: a small state) or once the interpreter refuses new ones (a save made by an
    ``atexit`` handler runs after concurrent.futures shut down)."""

    def __init__(self, workers: int) -> None:
        self._pool: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deltackpt-encode",
                               initializer=threads.leave_signals_to_main) if workers > 0 else None)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._pool is not None:
            try:
                return self._pool.submit(fn, *args)
            except RuntimeError:  # 'cannot schedule new futures after interpreter shutdown'
                pass
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed to whoever takes the result, as a pool does
            # (a Ctrl-C or SystemExit is not: it stops the save now, as it would while the
            # caller waited on a pool's result, instead of after the chunks still in the window)
            fut.set_exception(exc)
        return fut

    def __enter__(self) -> "EncoderPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._pool is not None:
            # an abandoned or failed save does not wait for chunks nobody will take
            self._pool.shutdown(wait=True, cancel_futures=exc[0] is not None)
