"""Abandoning the saves in flight when the process is exiting and must not wait for them.

The exit drain (:mod:`deltackpt.snapshot.at_exit`) sets the flag on a second Ctrl-C; a save
checks it before each chunk and stops with :class:`~deltackpt.errors.SaveAbandonedError`.  It
then aborts like any failed save: its temp files are deleted and its save lock released, so the
repository holds nothing of it (a save past its last chunk commits: a commit takes milliseconds
and is atomic either way).  The flag is never cleared in a running process: it is only set when
the process is about to end.
"""

from __future__ import annotations

import threading

from ...errors import SaveAbandonedError

_requested = threading.Event()


def request() -> None:
    """Make every save of this process stop at its next chunk."""
    _requested.set()


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise :class:`SaveAbandonedError` once :func:`request` was called."""
    if _requested.is_set():
        raise SaveAbandonedError("the process is exiting and abandoned this save (a second Ctrl-C); "
                                 "nothing of it was committed")
