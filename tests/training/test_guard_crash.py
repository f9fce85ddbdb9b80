"""The data window a rollback skipped stays skipped after the process is SIGKILLed and the run
resumes: a real child trains, rolls back on a NaN, trains K steps on and is killed, and a new run
resumed with deltackpt.resume continues past the window, never from a version of the bad stretch.
The child waits at its marker to be killed, so the kill lands at a known step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import deltackpt
from tests.conftest import ROOT
from tests.training._guarded import make_run, train


def _kill_after_marker(repo: str, marker: str, k: int) -> dict:
    child = subprocess.Popen([sys.executable, "-m", "tests.training.guard_child", repo, marker, str(k)], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not os.path.exists(marker):
            if child.poll() is not None:
                raise AssertionError(f"child exited {child.returncode}: {child.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the child never rolled back"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    with open(marker) as f:
        return json.load(f)


@pytest.mark.parametrize("k", [0, pytest.param(7, marks=pytest.mark.slow)])
def test_skipped_window_stays_skipped_after_sigkill_and_resume(tmp_path, repo_path, k):
    """K=0: killed right after the rollback (resumes from the version the rollback committed);
    K=7: killed after the next save.  Either way the resumed run starts at or past the end of the
    skipped window and never trains on a sample of it in that epoch."""
    rb = _kill_after_marker(repo_path, str(tmp_path / "marker"), k)
    (start_epoch, start), (end_epoch, end) = rb["skipped"]
    assert (start_epoch, start, end_epoch, end) == (0, 240, 0, 264)

    window = set(make_run(str(tmp_path / "probe")).sampler._order()[start:end])   # epoch 0's order
    run = make_run(repo_path, resume=True)
    assert run.info.version.id not in rb["abandoned"] and run.info.version.id != rb["to"]
    assert run.sampler.epoch == 0 and run.sampler.consumed >= end
    if k == 0:
        assert (run.info.version.id, run.info.step) == (rb["committed"], 30)
    left = (512 - run.sampler.consumed) // 8          # batches left in epoch 0
    train(run, run.step + 20)
    epoch0 = [i for _, idx in run.seen[:left] for i in idx]
    assert epoch0 and not window & set(epoch0)
    run.ckpt.close()
