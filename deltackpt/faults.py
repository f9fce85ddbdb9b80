"""Fault injection at named I/O sites, for the crash and error tests (tests/reliability).

``DELTACKPT_FAULT="site:N:action"`` makes the Nth hit (1-based) of ``site`` do ``action``:
``kill`` (SIGKILL this process), ``enospc`` / ``eio`` (raise that OSError), ``short_write``
(write half the bytes, then raise EIO), ``stall`` (sleep for an hour), ``sleepX`` (sleep X seconds,
then go on: widens a race window deterministically), ``stop`` (SIGSTOP itself: frozen exactly at
the site until someone sends SIGCONT).  ``site`` may end in ``*``.
``DELTACKPT_FAULT_TRACE=path`` appends every site hit to ``path``.  Unset, :func:`hit` is one
global lookup and a return.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
import time

_SPEC = os.environ.get("DELTACKPT_FAULT", "")
_TRACE = os.environ.get("DELTACKPT_FAULT_TRACE", "")
ACTIVE = bool(_SPEC or _TRACE)
_counts: dict[str, int] = {}


class ShortWrite(OSError):
    """Raised by a ``short_write`` fault after the caller wrote half its bytes."""


def hit(site: str) -> str | None:
    """Mark that the I/O step ``site`` is about to run; returns ``"short_write"`` when the caller
    must write half its data and then fail, else None (or raises / kills)."""
    if not ACTIVE:
        return None
    if _TRACE:
        with open(_TRACE, "a") as f:
            f.write(site + "\n")
    if not _SPEC:
        return None
    pattern, nth, action = _SPEC.rsplit(":", 2)
    if not fnmatch.fnmatchcase(site, pattern):
        return None
    _counts[pattern] = _counts.get(pattern, 0) + 1
    if _counts[pattern] != int(nth):
        return None
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"injected ENOSPC at {site}")
    if action == "eio":
        raise OSError(errno.EIO, f"injected EIO at {site}")
    if action == "stall":
        time.sleep(3600)
    if action == "short_write":
        return "short_write"
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return None
    if action.startswith("sleep"):
        time.sleep(float(action[5:]))
        return None
    raise ValueError(f"unknown fault action {action!r}")
