"""Deltification after saves, in the background: one thread per open repository, at idle priority,
a bounded step at a time, so it never competes with the training loop for a core.

A save commits, then calls :func:`after_commit`; the repository's thread wakes up and runs
:func:`deltify.deltify` steps (each begins at most ``STEP_BYTES`` of replaced copies, under a save
lock) until no candidate is left or a step finds nothing worth doing.  It leaves the ``lag`` newest versions alone: a training loop with a
``keep_last=N`` retention sets ``lag`` to N (``Repository.deltify_lag``), so versions retention is
about to drop never cost a delta write.

At interpreter exit the thread is asked to stop at its next safe point (a step in progress abandons
its unfinished pack: nothing a reader sees changes) and is waited for briefly; it is a daemon, so a
step that does not stop in time dies with the process, which is as safe as a crash (spec §14).

Set ``DELTACKPT_DELTIFY=off`` (or :data:`AUTO` to False) to leave deltification to gc and
``deltackpt deltify``.
"""

from __future__ import annotations

import os
import threading
import weakref

from ... import priority, threads
from ...errors import DeltackptError
from . import deltify as deltify_mod

#: deltify in the background after each save (``DELTACKPT_DELTIFY=off`` turns it off)
AUTO = os.environ.get("DELTACKPT_DELTIFY", "on").lower() not in ("0", "off", "no", "false")
#: how long the end of the process waits for a running step to stop
EXIT_WAIT_SECONDS = 5.0

_workers: "weakref.WeakValueDictionary[int, Deltifier]" = weakref.WeakValueDictionary()
_workers_lock = threading.Lock()


class Deltifier:
    """The background deltification of one repository handle.

    Example::

        d = Deltifier(repo); d.poke(); d.wait_idle(10.0)
    """

    def __init__(self, repo) -> None:
        self._repo = weakref.ref(repo)
        self._cond = threading.Condition()
        self._pending = False
        self._busy = False
        self._stopping = False
        self.last_report: deltify_mod.DeltifyReport | None = None
        self.last_error: BaseException | None = None
        self.chunks_done = 0      # chunks deltified by this thread so far
        self.written_bytes = 0    # and the bytes that cost
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Ask for a run (again) once the current one, if any, is done."""
        with self._cond:
            if self._stopping:
                return
            self._pending = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="deltackpt-deltify", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no run is pending or in progress; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def stop(self, timeout: float = EXIT_WAIT_SECONDS) -> None:
        """Stop at the next safe point and wait up to ``timeout`` seconds for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        threads.leave_signals_to_main()
        priority.run_idle(True)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping)
                if self._stopping:
                    self._busy = self._pending = False
                    self._cond.notify_all()
                    return
                self._pending, self._busy = False, True
            try:
                self._run()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _run(self) -> None:
        while not self._stopping:
            repo = self._repo()
            if repo is None:
                return
            priority.run_idle(True)  # a caller waiting for a save boosts every idle thread: go back
            try:
                report = deltify_mod.deltify(repo, lag=repo.deltify_lag, max_bytes=deltify_mod.STEP_BYTES,
                                             stop=lambda: self._stopping)
            except (DeltackptError, OSError) as exc:
                self.last_error = exc  # the next save or gc tries again; nothing was lost
                return
            self.last_report = report
            self.chunks_done += report.chunks
            self.written_bytes += report.written_bytes
            del repo
            if report.remaining == 0 or report.chunks == 0:
                return  # done, or nothing more is worth doing until the next save


def deltifier(repo) -> Deltifier:
    """The background deltifier of a repository handle (made on first use)."""
    d = getattr(repo, "_deltifier", None)
    if d is None:
        with _workers_lock:
            d = getattr(repo, "_deltifier", None)
            if d is None:
                d = repo._deltifier = Deltifier(repo)
                _workers[id(d)] = d
    return d


def after_commit(repo) -> None:
    """A save committed a version: deltify what it made older, in the background."""
    if AUTO and repo.config.delta_base == "child" and repo.config.keyframe_interval > 0:
        deltifier(repo).poke()


def stop_for(repo, timeout: float = EXIT_WAIT_SECONDS) -> None:
    """Stop a repository handle's background deltifier, if it has one, at its next safe point
    (``Repo.close``: the caller may delete the folder next)."""
    d = getattr(repo, "_deltifier", None)
    if d is not None:
        d.stop(timeout)
        with _workers_lock:
            _workers.pop(id(d), None)


def wait_all_idle(timeout: float | None = None) -> bool:
    """Wait until every background deltifier of this process is idle; False if one still runs
    after ``timeout`` seconds (each gets the whole timeout).  For benchmarks and tests that measure
    a repository between saves.

    Example::

        deltackpt.save(state, "ckpt"); wait_all_idle(60.0)
    """
    return all(d.wait_idle(timeout) for d in list(_workers.values()))


def _stop_all() -> None:
    for d in list(_workers.values()):
        d.stop()


try:
    getattr(threading, "_register_atexit", lambda fn: None)(_stop_all)
except RuntimeError:
    pass  # first imported while the interpreter shuts down: nothing runs in the background then
