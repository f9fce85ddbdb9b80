"""The threads deltackpt starts leave the process's signals to the main thread.

The kernel hands a signal sent to the process (Ctrl-C's SIGINT, SIGTERM from ``kill`` or a
scheduler) to any thread that does not block it.  Python runs signal handlers in the main thread
only; when a save thread receives the signal, the main thread learns of it at its next bytecode,
and a main thread blocked in one long C call (a ``time.sleep``, a collective, a data-loader
``get``) is not woken at all: the Ctrl-C seems ignored.  Every thread deltackpt starts blocks the
signals Python handles, so the kernel always picks the main thread (or one of the application's
own).  Threads inherit the mask, so the pools a save thread starts (the encoder's workers,
Blosc's and zstd's threads) block them too.

Example::

    from concurrent.futures import ThreadPoolExecutor
    from deltackpt import threads
    pool = ThreadPoolExecutor(max_workers=2, initializer=threads.leave_signals_to_main)
    call = threads.BackgroundCall(lambda: os.fdatasync(fd), "deltackpt-writeback")
    error = call.join()   # the OSError it raised, or None
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

from . import priority

_HANDLED_BY_PYTHON = tuple(s for s in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM")
                           if hasattr(signal, s))


def leave_signals_to_main() -> None:
    """Block, in the calling thread, the signals an application may handle in Python (never in
    the main thread, which must keep receiving them)."""
    if threading.current_thread() is threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, s) for s in _HANDLED_BY_PYTHON})
    except (OSError, ValueError):
        pass  # not permitted here: the thread keeps the mask it inherited


def start_worker(idle: bool) -> None:
    """A pool's initializer: leave signals to the main thread and run at idle priority or not
    (:mod:`deltackpt.priority`)."""
    leave_signals_to_main()
    priority.run_idle(idle)


class BackgroundCall:
    """``fn()`` on a thread of its own that leaves signals to the main thread; an OSError it raises
    is kept for :meth:`join` to return.  The stores' background writes and fdatasyncs: their owner
    (a StagedFile, a LocalWriter) joins it before the descriptor it uses is closed."""

    def __init__(self, fn: Callable[[], object], name: str) -> None:
        self._error: OSError | None = None

        def run() -> None:
            leave_signals_to_main()
            try:
                fn()
            except OSError as exc:
                self._error = exc
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> OSError | None:
        """Wait for the call; the error it raised, if any."""
        self._thread.join()
        return self._error
