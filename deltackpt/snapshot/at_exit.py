"""Background saves outlive the script that made them: normal exit, ``sys.exit``, an uncaught
exception, Ctrl-C and SIGTERM all finish the saves in flight before the process ends.

Exit: the interpreter's exit (:func:`threading._shutdown`, which runs before ``atexit`` handlers)
calls :func:`finish_pending` before concurrent.futures stops accepting work, so the saves in
flight finish with every thread they use still working.  It says so on stderr, and reports a
save that failed there (nobody is left to call ``wait``).  Background work asked for after that (a
save made by an ``atexit`` handler) runs inline: no new thread is started.

This module holds the one process-wide record of background saves (:class:`_Process`): the live
save runtimes, weakly.  Exit and SIGTERM belong to the process; everything else a save starts
belongs to its repository handle.

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
from typing import Any, Iterable, Protocol

from ..repo.write import abandon


class Runtime(Protocol):
    """What the exit needs of a handle's save runtime (:class:`.runtime.SaveRuntime`)."""

    location: str

    def pending(self) -> list: ...

    def after_fork(self) -> None: ...

    def join_idle(self) -> None: ...


class _Process:
    """The process-wide part of background saves, and the only one: the interpreter's exit and
    SIGTERM belong to the process, not to a handle.  It knows each save runtime that has work or
    an uncollected save (a failed save nobody waited for is raised by the next save to its
    repository, or reported at exit), to finish their saves at exit and to let a new save to a
    repository wait for earlier ones to it (commit order).  A runtime leaves it when it is closed,
    or released with every save collected."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runtimes: set[Any] = set()
        self.draining = False
        self.armed = False
        self.exiting = False


_process = _Process()


def track(runtime: Runtime) -> None:
    """Count ``runtime``'s saves among this process's (a save runtime does at creation)."""
    with _process.lock:
        _process.runtimes.add(runtime)


def untrack(runtime: Runtime) -> None:
    with _process.lock:
        _process.runtimes.discard(runtime)


def runtimes() -> list[Any]:
    with _process.lock:
        return list(_process.runtimes)


def pending() -> list:
    """The handles of every background save of this process not done yet."""
    return [h for r in runtimes() for h in r.pending()]


def others_for(location: str, mine: Any = None) -> list[Any]:
    """The other live runtimes of this process saving to ``location`` (another handle on the same
    repository: a save waits for theirs, so versions commit in the order they were saved)."""
    return [r for r in runtimes() if r is not mine and r.location == location and r.pending()]


def exiting() -> bool:
    """True once the interpreter's exit began: new background work then runs inline (a save made
    by an ``atexit`` handler), since no new thread may be relied on."""
    return _process.exiting


def boost(handles: Iterable[Any]) -> None:
    from .handle import boost_unless_done
    boost_unless_done(list(handles))


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) has no save thread: it must not wait for the
    parent's saves when it exits, nor hold the SIGTERM handler to them."""
    _process.draining = False
    _process.lock = threading.Lock()
    for r in list(_process.runtimes):
        r.after_fork()
    _process.runtimes = set()


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
    them, a third stops waiting.  From here on new background work runs inline."""
    _process.exiting = True
    handles = pending()
    if not handles:
        return
    _process.draining = True
    try:
        _finish(handles)
    finally:
        _process.draining = False   # a SIGTERM after this (an atexit handler running) acts as without us


def _finish(handles: list) -> None:
    try:  # a Ctrl-C may land anywhere from here on, the first lines included
        _say(f"finishing {len(handles)} background save(s) before exit (Ctrl-C again abandons them)")
        boost(handles)
        _wait(handles)
        for r in runtimes():   # their threads end once idle: none may still run when the interpreter goes
            r.join_idle()
    except KeyboardInterrupt:
        try:
            abandon.request()
            _say("abandoning the background save(s): each stops at its next chunk and leaves nothing behind")
            _wait(handles)
        except KeyboardInterrupt:
            abandon.request()
            _say("not waiting any longer: the next save or gc removes what the unfinished ones left")
            return
    _report(handles)


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
    if _process.armed or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
        _process.armed = True   # a handler of the application's own is never replaced, now or later
    except (ValueError, OSError, AttributeError):
        pass  # no SIGTERM here, or not the main interpreter


def _on_sigterm(signum: int, frame: Any) -> None:
    if _process.draining:
        _say("SIGTERM: still finishing the background save(s)")
        return
    handles = pending()
    if not handles:
        # nothing to finish: die of the signal, as without deltackpt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _say(f"SIGTERM: stopping the script to finish {len(handles)} background save(s) (exit status {128 + signum})")
    raise SystemExit(128 + signum)


try:
    # threading._shutdown calls these before atexit handlers and before concurrent.futures stops
    # taking work, so the saves in flight finish with every thread they use still working
    getattr(threading, "_register_atexit", lambda fn: None)(finish_pending)
except RuntimeError:
    _process.exiting = True   # first imported while the interpreter shuts down (a save from an atexit handler)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
