"""A DCP save and gc: the chunks every rank stored in ``write_data`` are named by no manifest until the
coordinator's ``finish``; gc must not delete them in between (issue 16, item 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

import deltackpt
import deltackpt.dcp
from tests.conftest import ROOT, proc_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

_SAVER = textwrap.dedent("""
    import sys, warnings
    import torch, torch.distributed.checkpoint as dcp
    import deltackpt.dcp
    torch.manual_seed(7)
    state = {"w": torch.randn(256, 256), "b": torch.randn(256)}
    w = deltackpt.dcp.Writer(sys.argv[1], step=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=w)
    print(w.version_id, flush=True)
""")


def test_gc_between_write_data_and_finish_keeps_the_chunks(tmp_path):
    """gc run while a DCP save has stored its chunks but not committed (frozen in ``finish``, just before
    the refs lock) waits for that save, and the version ``dcp.save`` then returns loads bit-exactly."""
    repo = str(tmp_path / "r")
    torch.manual_seed(1)
    first = {"w": torch.randn(256, 256), "b": torch.randn(256)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(first, storage_writer=deltackpt.dcp.Writer(repo, step=1))
    env = {**os.environ, "DELTACKPT_FAULT": "lock.refs.write:1:stop", "OMP_NUM_THREADS": "1"}
    saver = subprocess.Popen([sys.executable, "-c", _SAVER, repo], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while proc_state(saver.pid) != "T":
            assert saver.poll() is None, saver.communicate()
            assert time.monotonic() < deadline, "the DCP saver never reached finish"
            time.sleep(0.02)
        done = threading.Event()
        errors: list[BaseException] = []

        def gc() -> None:
            try:
                deltackpt.gc(repo, keep_last=1, grace_seconds=0)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
            done.set()

        t = threading.Thread(target=gc, daemon=True)
        t.start()
        # gc must wait for the in-flight save (the old code finished at once, deleting its chunks)
        assert not done.wait(2.0), f"gc finished while a DCP save was between write_data and finish: {errors}"
        os.kill(saver.pid, signal.SIGCONT)
        out, err = saver.communicate(timeout=120)
        assert saver.returncode == 0, err
        t.join(120)
        assert done.is_set() and not errors, errors
    finally:
        if saver.poll() is None:
            os.kill(saver.pid, signal.SIGKILL)
            saver.wait()
    vid = out.split()[-1]
    torch.manual_seed(7)
    expected = {"w": torch.randn(256, 256), "b": torch.randn(256)}
    back = {k: torch.zeros_like(v) for k, v in expected.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(back, storage_reader=deltackpt.dcp.Reader(repo, version=vid))
    for k in expected:
        assert torch.equal(back[k], expected[k]), k
    assert deltackpt.Repo(repo).verify().ok
    assert not os.listdir(os.path.join(repo, "locks")), "a lock was left behind"


def test_writer_pickles_while_it_holds_the_in_flight_save_lock(tmp_path):
    """A coordinator Writer between its global plan and finish (holding the save lock) still pickles
    for spawned ranks; the copy holds no lock, and the original releases its own."""
    import pickle

    from torch.distributed.checkpoint.planner import SavePlan

    repo = str(tmp_path / "r")
    w = deltackpt.dcp.Writer(repo, step=1)
    w.set_up_storage_writer(True)
    w.prepare_global_plan([SavePlan([])])
    store = w._repo().core.store
    assert any(k.startswith("locks/save-") for k in store.list("locks/"))
    copy = pickle.loads(pickle.dumps(w))
    assert copy._inflight is None
    w._release_inflight()
    assert not any(k.startswith("locks/save-") for k in store.list("locks/"))
