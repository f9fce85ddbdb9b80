"""What a load or a blocking save costs the process around it: the collector's work, the modules
it imports."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import deltackpt
from deltackpt.gcpause import collector_paused
from tests.conftest import ROOT
from tests.strategies import assert_bit_identical


def _many_tensors(n: int = 600) -> dict:
    # a manifest of many small tensors: enough objects that a load builds hundreds of containers
    g = torch.Generator().manual_seed(3)
    return {f"layer{i}.weight": torch.randn(8, 8, generator=g) for i in range(n)}


def _collections_during(call) -> tuple[list[int], object]:
    started: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])
    gc.collect()
    gc.callbacks.append(record)
    try:
        out = call()
    finally:
        gc.callbacks.remove(record)
    return started, out


def test_a_load_and_a_restore_run_no_collection(repo_path, monkeypatch):
    """The objects a load builds (manifest, plan, index) die with the call: the collector is
    paused for it, so none of them is promoted and counted toward the process's next full
    collection; only what the call returns is, at the one young collection after it.  The same
    load with the pause taken out runs several."""
    from deltackpt.api import loading
    state = _many_tensors()
    deltackpt.save(state, repo_path)
    with deltackpt.Repo(repo_path) as repo:
        with monkeypatch.context() as m:   # the premise: without the pause this load does collect
            m.setattr(loading, "collector_paused", contextlib.nullcontext)
            started, _ = _collections_during(lambda: deltackpt.load(repo))
        assert len(started) > 1, "the state is too small for this test to see collections"
        started, loaded = _collections_during(lambda: deltackpt.load(repo))
        # at most the one young collection that counts what the load returns, as the pause ends
        assert started in ([], [0]) and gc.isenabled()
        assert_bit_identical(state, loaded)
        model = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(torch.zeros(8, 8)) for k in state})
        renamed = {k.replace(".", "_"): v for k, v in state.items()}
        deltackpt.save(renamed, repo)
        started, _ = _collections_during(lambda: deltackpt.restore(model, repo))
        assert started in ([], [0]) and gc.isenabled()
        assert all(torch.equal(model[k], v) for k, v in renamed.items())


def test_a_failed_load_turns_the_collector_back_on_and_an_off_collector_stays_off(repo_path):
    deltackpt.save({"w": torch.ones(3)}, repo_path)
    with pytest.raises(deltackpt.UnknownVersionError):
        deltackpt.load(repo_path, "no-such-tag")
    assert gc.isenabled()
    gc.disable()
    try:
        deltackpt.load(repo_path)
        assert not gc.isenabled()   # the program turned it off: the load leaves it off
    finally:
        gc.enable()


def test_pauses_from_two_threads_end_with_the_last_one():
    """The collector's switch is the interpreter's: a pause that ends while another thread's is
    still on leaves it off, and the last one to end turns it back on."""
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def other() -> None:
        with collector_paused():
            second_in.set()
            first_out.wait(10)
            seen["after the first ended"] = gc.isenabled()
    with collector_paused():
        first_in.set()
        t = threading.Thread(target=other)
        t.start()
        assert second_in.wait(10)
    first_out.set()
    t.join(10)
    assert seen == {"after the first ended": False}
    assert gc.isenabled()


def test_a_load_in_a_fresh_process_imports_neither_the_write_path_nor_maintenance(repo_path):
    """``deltackpt.load`` imports what reading needs: not the write path (a handle makes its write
    session at its first save), deltification, gc, verify or the Repo class built on them; of the
    codecs, only those the version's objects name (a keyframe: no delta or lossy codec); of the
    stores, only the local one; and not python-blosc where the compiled loops decode instead (a
    restart's first load pays for every module it imports)."""
    from deltackpt.codecs import native_planes
    deltackpt.save({"w": torch.arange(10.0)}, repo_path)
    script = ("import sys, json, torch, deltackpt\n"
              f"deltackpt.load({repo_path!r})\n"
              "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, check=True).stdout
    modules = json.loads(out.strip().splitlines()[-1])
    assert "deltackpt.repo.read.reader" in modules   # it did load through the read path
    assert {"deltackpt.codecs.raw", "deltackpt.codecs.zstd"} & set(modules)   # and decoded its chunk
    unneeded = [m for m in modules if m.startswith(("deltackpt.repo.maintain", "deltackpt.api.saving",
                                                    "deltackpt.api.repo", "deltackpt.repo.write",
                                                    "deltackpt.repo.delta_cache", "deltackpt.snapshot"))]
    codecs = ("xor_delta", "sub_delta", "sparse", "quantize", "cast", "scaled_delta", "scaled_quantize", "pipeline")
    unneeded += [m for m in modules if m in {f"deltackpt.codecs.{c}" for c in codecs}]
    stores = ("fsspec_store", "memory", "counting", "cache")
    unneeded += [m for m in modules if m in {f"deltackpt.store.{s}" for s in stores} or m == "fsspec"]
    if native_planes.compiled():
        unneeded += [m for m in modules if m == "blosc" or m.startswith("blosc.")]
    assert unneeded == []


def test_a_blocking_save_runs_no_collection_a_background_one_leaves_the_collector_on(repo_path, monkeypatch):
    """A blocking save pauses the collector like a load: its manifest, plan and index objects are
    never promoted.  A background save does not: its thread runs beside the caller's code, whose
    collector is the program's business."""
    from deltackpt.api import saving
    state = _many_tensors()
    with deltackpt.Repo(repo_path, create=True) as repo:
        repo.save(state)
        with monkeypatch.context() as m:   # the premise: without the pause this save does collect
            m.setattr(saving, "collector_paused", contextlib.nullcontext)
            started, _ = _collections_during(lambda: repo.save({k: v + 1 for k, v in state.items()}))
        assert len(started) > 1, "the state is too small for this test to see collections"
        changed = {k: v + 2 for k, v in state.items()}
        started, _ = _collections_during(lambda: repo.save(changed))
        assert started in ([], [0]) and gc.isenabled()
        assert_bit_identical(changed, deltackpt.load(repo))
        paused_inside: list[bool] = []
        h = repo.save({k: v + 3 for k, v in state.items()}, blocking=False)
        paused_inside.append(gc.isenabled())
        h.wait()
        assert paused_inside == [True] and gc.isenabled()


def test_a_child_forked_during_a_pause_gets_its_collector_back():
    """A process forked while a pause is on (another thread starting DataLoader workers during a
    load) does not inherit the pause: its collector is on."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    with collector_paused():
        assert not gc.isenabled()
        pid = os.fork()
        if pid == 0:   # the child: report through the exit status, never return into pytest
            os._exit(0 if gc.isenabled() else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert gc.isenabled()
