"""Background saves outlive the script that made them: normal exit, ``sys.exit``, an uncaught
exception, Ctrl-C and SIGTERM all finish the saves in flight before the process ends.

Exit: the interpreter's exit (:func:`threading._shutdown`, which runs before ``atexit`` handlers)
calls :func:`finish_pending` before concurrent.futures stops accepting work, so the saves in
flight finish with every thread pool they use still working.  It says so on stderr, and reports a
save that failed there (nobody is left to call ``wait``).

Ctrl-C: Python turns SIGINT into ``KeyboardInterrupt`` in the main thread; the script unwinds and
exits, and the exit finishes the saves.  A second Ctrl-C during that wait abandons them
(:mod:`deltackpt.repo.write.abandon`): each stops before its next chunk, deletes its temp files and
releases its lock, so nothing partial is left; a third stops waiting altogether.

SIGTERM (what ``kill``, Kubernetes, Slurm and torchrun send): its default action ends the process
at once, with no exit handler.  While a background save is pending, and only when the signal's
handler was the default one, the first background save made from the main thread installs
:func:`_on_sigterm`: with saves pending it raises ``SystemExit(143)`` in the main thread (the
script stops where it was, ``finally`` blocks run, the exit finishes the saves, exit status 143 =
128 + SIGTERM, as a shell reports a process killed by SIGTERM); with none pending it restores the
default action and sends SIGTERM again, so the process dies of it exactly as before.  A handler
the application installed is left alone (it decides; its ``sys.exit`` finishes the saves).  A
SIGTERM that arrives while the exit is already finishing saves does not interrupt them (the
sender's SIGKILL, if it comes, does).  ``os._exit`` and SIGKILL end the process with no chance to
finish: the repository then holds the versions committed before, and the next save removes what
the killed one left (spec/FORMAT.md §13).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable

from ..repo.write import abandon

_pending: Callable[[], list] = list   # the handles not yet done (set by async_save)
_boost: Callable[[list], None] = lambda handles: None
_draining = False
_armed = False


def install(pending: Callable[[], list], boost: Callable[[list], None]) -> None:
    """Hook the exit: ``pending()`` lists the handles of background saves not done yet,
    ``boost(handles)`` lifts their idle priority."""
    global _pending, _boost
    _pending, _boost = pending, boost
    try:
        # registered after concurrent.futures' own hook (imported first), so called before it
        getattr(threading, "_register_atexit", lambda fn: None)(finish_pending)
    except RuntimeError:
        pass  # first imported while the interpreter shuts down (a save from an atexit handler)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_in_child)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) has no save thread: it must not wait for the
    parent's saves when it exits, nor hold the SIGTERM handler to them."""
    global _draining
    _draining = False


def _wait(handles: list) -> None:
    """Wait for every handle; KeyboardInterrupt (a Ctrl-C) comes through, a save's own error does not."""
    for h in handles:
        h._future.exception()


def _say(text: str) -> None:
    try:
        sys.stderr.write(f"deltackpt: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed: the saves still finish


def finish_pending() -> None:
    """Wait for the background saves still in flight (interpreter exit); a second Ctrl-C abandons
    them, a third stops waiting."""
    global _draining
    pending = _pending()
    if not pending:
        return
    _draining = True
    try:
        _finish(pending)
    finally:
        _draining = False   # a SIGTERM after this (an atexit handler running) acts as without us


def _finish(pending: list) -> None:
    try:  # a Ctrl-C may land anywhere from here on, the first lines included
        _say(f"finishing {len(pending)} background save(s) before exit (Ctrl-C again abandons them)")
        _boost(pending)
        _wait(pending)
    except KeyboardInterrupt:
        try:
            abandon.request()
            _say("abandoning the background save(s): each stops at its next chunk and leaves nothing behind")
            _wait(pending)
        except KeyboardInterrupt:
            abandon.request()
            _say("not waiting any longer: the next save or gc removes what the unfinished ones left")
            return
    _report(pending)


def _report(handles: list) -> None:
    from ..errors import SaveAbandonedError
    abandoned = 0
    for h in handles:
        exc = h._future.exception() if h._future.done() else None
        if isinstance(exc, SaveAbandonedError):
            abandoned += 1
        elif exc is not None and not h._observed:
            _say(f"a background save failed at exit: {type(exc).__name__}: {exc}")
    if abandoned:
        _say(f"{abandoned} background save(s) abandoned; nothing of them was committed")


def arm_sigterm() -> None:
    """Called at each background save: install :func:`_on_sigterm` if SIGTERM still has its
    default action and this is the main thread (the only one that may set handlers)."""
    global _armed
    if _armed or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
        _armed = True   # a handler of the application's own is never replaced, now or later
    except (ValueError, OSError, AttributeError):
        pass  # no SIGTERM here, or not the main interpreter


def _on_sigterm(signum: int, frame: Any) -> None:
    if _draining:
        _say("SIGTERM: still finishing the background save(s)")
        return
    pending = _pending()
    if not pending:
        # nothing to finish: die of the signal, as without deltackpt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _say(f"SIGTERM: stopping the script to finish {len(pending)} background save(s) (exit status {128 + signum})")
    raise SystemExit(128 + signum)
