"""Background saves run under SCHED_IDLE and are boosted back to normal priority when waited for
(real threads, real scheduler policies; skipped where the platform cannot leave SCHED_IDLE)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import deltackpt
from deltackpt.snapshot import async_save
from deltackpt import priority

pytestmark = pytest.mark.skipif(not priority.idle_supported(),
                                reason="SCHED_IDLE cannot be left again here (no CAP_SYS_NICE, or not Linux)")


def _policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


def _until(done, seconds: float = 30) -> None:
    """Poll until ``done()`` (observing a job without waiting on its handle: a wait boosts)."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_background_save_and_the_threads_it_starts_run_idle_and_the_caller_stays_normal(tmp_path):
    repo = deltackpt.Repo(str(tmp_path / "repo"), create=True)
    seen: dict[str, int] = {}

    def job() -> None:
        seen["save thread"] = _policy()
        child = threading.Thread(target=lambda: seen.__setitem__("its thread", _policy()))
        child.start()
        child.join()

    async_save.run_after(repo.runtime, job)
    _until(lambda: len(seen) == 2)
    assert seen == {"save thread": os.SCHED_IDLE, "its thread": os.SCHED_IDLE}
    assert _policy() == os.SCHED_OTHER
    h = deltackpt.save({"w": torch.arange(1000.0)}, repo, blocking=False)
    h.wait()
    repo.close()


def test_waiting_for_a_save_boosts_it_back_to_normal_priority(tmp_path):
    """The job sees its own policy turn from idle to normal only because the caller waits for it:
    without the boost it would time out and report idle."""
    repo = deltackpt.Repo(str(tmp_path / "repo"), create=True)
    started = threading.Event()

    def job() -> list[int]:
        seen = [_policy()]
        started.set()
        _until(lambda: _policy() != os.SCHED_IDLE, 20)
        return seen + [_policy()]

    handle = async_save.run_after(repo.runtime, job)
    assert started.wait(30)
    assert handle.wait() == [os.SCHED_IDLE, os.SCHED_OTHER]
    repo.close()


def test_a_save_waited_for_by_the_next_one_is_boosted_too(tmp_path):
    """The next save waits for the one in flight (``drain``) like ``wait`` does, so it boosts too."""
    repo = deltackpt.Repo(str(tmp_path / "repo"), create=True)
    started = threading.Event()
    seen: list[int] = []

    def job() -> None:
        started.set()
        _until(lambda: _policy() != os.SCHED_IDLE, 20)
        seen.append(_policy())

    async_save.run_after(repo.runtime, job)
    assert started.wait(30)
    deltackpt.save({"w": torch.ones(10)}, repo, blocking=False).wait()   # drains the job first
    assert seen == [os.SCHED_OTHER]
    repo.close()


def test_a_save_waited_for_before_its_thread_starts_never_runs_idle(tmp_path):
    """Someone waits for a job still queued behind another (the exit drain right after the last
    save): when it starts, it stays at normal priority.  It used to enter SCHED_IDLE after the
    boost, and on a loaded machine an idle save at exit may never run (the script hung)."""
    repo = deltackpt.Repo(str(tmp_path / "repo"), create=True)
    gate = threading.Event()
    async_save.run_after(repo.runtime, gate.wait)           # the save thread is busy
    queued = async_save.run_after(repo.runtime, _policy)       # reports its policy when it starts
    waiter = threading.Thread(target=queued.wait)
    waiter.start()
    _until(lambda: queued._waited.is_set())
    gate.set()
    waiter.join(30)
    assert queued.wait() == os.SCHED_OTHER
    repo.close()


def test_with_idle_off_background_saves_run_at_normal_priority(tmp_path):
    from deltackpt.snapshot.runtime import BackgroundOptions
    repo = deltackpt.Repo(str(tmp_path / "repo"), create=True, background=BackgroundOptions(idle=False))
    seen: list[int] = []

    def job() -> None:
        seen.append(_policy())

    async_save.run_after(repo.runtime, job)
    _until(lambda: seen)
    assert seen == [os.SCHED_OTHER]
    repo.close()


def test_the_read_pool_never_inherits_idle_priority_from_a_save_thread(tmp_path, monkeypatch):
    """The read pool, created from a background save's thread, does not inherit SCHED_IDLE (a
    restore would crawl on a busy machine)."""
    from deltackpt.torchstate import materialize
    repo = deltackpt.Repo(str(tmp_path / "repo"), create=True)
    seen: list[int] = []

    def job() -> None:
        seen.append(_policy())
        with materialize.pool() as workers:
            seen.append(workers.submit(_policy).result())

    async_save.run_after(repo.runtime, job)
    _until(lambda: len(seen) == 2)
    assert seen == [os.SCHED_IDLE, os.SCHED_OTHER]
    repo.close()
