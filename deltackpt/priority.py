"""CPU priority of background saves: idle while the training loop runs, normal once it waits.

A background save shares the machine's cores with the training loop.  Whenever more of its threads
are ready to run than there are spare cores (the encoder, the pack writer, the threads that start
writeback), the scheduler time-slices the loop's core among them and the loop waits in the run
queue; a save thread preempted while it holds the GIL makes the loop wait on the GIL as well.
Under Linux's ``SCHED_IDLE`` policy the save's threads run only on a core nothing else wants, so
the loop is never preempted by them (bench/ASYNC.md has the figures).

The price is starvation: on a machine busy with other work (data-loader workers on every core) an
idle save may make no progress.  So whenever the caller has to wait for a save
(``SaveHandle.wait``, the next save, the end of the process), :func:`boost` puts its threads back
to normal priority and the wait is no longer than it was without this.  Leaving ``SCHED_IDLE``
needs ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` of 20; where a probe finds that refused (or the
platform has no ``SCHED_IDLE``), saves run at normal priority: the idle policy is never entered
without a way out.

Example::

    from deltackpt.snapshot.runtime import BackgroundOptions
    repo = deltackpt.Repo("ckpt", background=BackgroundOptions(idle=False))   # normal priority
"""

from __future__ import annotations

import functools
import os
import threading


def _probe() -> bool:
    """Whether a thread of this process may enter SCHED_IDLE and leave it again (tried on a
    throwaway thread, so a refusal strands nothing)."""
    if not all(hasattr(os, n) for n in ("SCHED_IDLE", "SCHED_OTHER", "sched_setscheduler", "sched_getscheduler")):
        return False
    result: list[bool] = []

    def attempt() -> None:
        tid = threading.get_native_id()
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            result.append(os.sched_getscheduler(tid) == os.SCHED_OTHER)
        except OSError:
            result.append(False)

    t = threading.Thread(target=attempt, name="deltackpt-priority-probe", daemon=True)
    t.start()
    t.join()
    return bool(result and result[0])


@functools.lru_cache(maxsize=None)
def idle_supported() -> bool:
    """True when background saves can run under SCHED_IDLE and be boosted back: a fact about this
    process, probed once (two threads asking at once only repeat a harmless try)."""
    return _probe()


def run_idle(idle: bool) -> None:
    """Put the calling thread under SCHED_IDLE (a background save's), or back to normal priority
    when ``idle`` is False (a pool whose caller waits); the threads it starts inherit the policy.
    Does nothing where :func:`idle_supported` is False."""
    if not idle_supported():
        return
    tid = threading.get_native_id()
    try:
        if idle or os.sched_getscheduler(tid) == os.SCHED_IDLE:
            os.sched_setscheduler(tid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass  # refused after all (a seccomp filter, say): the save runs at normal priority


def boost() -> None:
    """Put every SCHED_IDLE thread of this process back to normal priority: the caller is about
    to wait for a background save, which must no longer yield to anything.  (A thread the
    application itself put under SCHED_IDLE is returned to normal too: Linux does not tell which
    thread started which.)"""
    if not idle_supported():
        return
    # again until a pass finds none: a thread an idle thread starts while we list inherits
    # SCHED_IDLE, and a missed encoder thread under a loaded machine starves the save it serves
    for _ in range(100):
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return
        found = False
        for name in tids:
            try:
                tid = int(name)
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    found = True
            except (OSError, ValueError):
                continue  # the thread ended meanwhile
        if not found:
            return


def boost_thread(tid: int) -> None:
    """Put the thread ``tid`` of this process back to normal priority if it is under SCHED_IDLE
    (a lazy snapshot copy the optimizer now waits for)."""
    if not idle_supported():
        return
    try:
        if os.sched_getscheduler(tid) == os.SCHED_IDLE:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass  # the thread ended meanwhile
