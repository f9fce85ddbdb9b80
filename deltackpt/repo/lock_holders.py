"""Who holds a lock, and whether that process is provably alive, provably dead or cannot be judged
from here (locks.py takes and breaks the locks; this module only judges their holders).

A pid names the same process only for a reader on the same host, in the same pid namespace, in
the same boot: :func:`holder_state` judges a lock body's holder only then.

Example::

    holder_state({"host": HOST, "pid": 1, "pidns": pid_namespace(), "boot": BOOT})   # "alive"
"""

from __future__ import annotations

import os
import socket
import time

HOST = socket.gethostname()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _boot_id() -> str | None:
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str | None:
    """The pid namespace this process lives in (``pid:[4026531836]``): a pid means the same
    process only to readers in the same namespace of the same boot."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """Clock ticks since boot at which ``pid`` started (tells a reused pid from the holder)."""
    stat = _read(f"/proc/{pid}/stat")
    try:
        return int(stat.rsplit(")", 1)[1].split()[19]) if stat else None
    except (IndexError, ValueError):
        return None


BOOT = _boot_id()


def _pid_alive(pid: int) -> bool:
    if pid >= 1 << 31:
        return False  # no process has it (pid_t is 32 bits; os.kill would raise OverflowError)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (killed child not yet reaped) still answers kill(0): look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def holder_state(info: dict) -> str:
    """``"dead"`` or ``"alive"`` when this process can tell, else ``"unknown"``.

    A pid can be judged only by a process that sees the same pids: same host name, same pid
    namespace, same boot.  A sidecar container sharing the host name (``--uts=host``, a Kubernetes
    pod) has its own pid namespace, where the saver's pid may be free or someone else's; a lock
    written before a reboot, or by an older deltackpt that did not record namespace and boot,
    cannot be judged either.  Those wait for the lease."""
    pid = info.get("pid")
    ns, boot = pid_namespace(), BOOT
    if (info.get("host") != HOST or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0
            or ns is None or boot is None or info.get("pidns") != ns or info.get("boot") != boot):
        return "unknown"
    if pid == os.getpid():
        return "unknown"  # our own lock (another thread's, or left by a failed release): the lease decides
    if not _pid_alive(pid):
        return "dead"
    start = info.get("start")
    if isinstance(start, int) and not isinstance(start, bool):
        now_start = start_time(pid)
        if now_start is not None and now_start != start:
            return "dead"  # the pid was reused by a process that started later
    return "alive"


def describe(info: dict | None) -> str:
    """The holder a lock body names, for an error message; fields of any type or size (a body may be
    damaged or hostile) give one short line."""
    if not info:
        return "an unknown process"
    when = info.get("time")
    try:
        since = time.ctime(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None
    except (OverflowError, ValueError, OSError):
        since = None
    return f"pid {_field(info.get('pid'))} on {_field(info.get('host'))} since {since or 'an unknown time'}"


def _field(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return " ".join(text.split())[:64] or "?"
