"""Background saves: snapshot semantics, error propagation, one save in flight, dedup."""

from __future__ import annotations

import threading

import pytest
import torch

import deltackpt
from deltackpt.snapshot import host_copy, runtime


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def test_returns_before_commit_and_saves_the_snapshot(repo_path):
    """The version holds the tensors as they were at the call, even when training changes them right after."""
    m = _model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    h = deltackpt.save(m, repo_path, step=1, blocking=False)
    assert isinstance(h, deltackpt.SaveHandle)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    v = h.wait()
    assert h.done() and v.step == 1 and h.stall_seconds >= 0 and h.staged_bytes == sum(
        t.numel() * t.element_size() for t in before.values())
    loaded = deltackpt.load(repo_path, v.id)
    for k, t in before.items():
        assert torch.equal(loaded[k], t), k


def test_shared_storage_and_plain_values_survive(repo_path):
    """Tied tensors come back sharing storage and plain values round-trip through a background save."""
    w = torch.randn(16, 4)
    state = {"a": w, "b": w[2:5], "empty": torch.zeros(0, 3), "cfg": {"lr": 0.1, "dims": (16, 4)}}
    deltackpt.save(state, repo_path, step=3, blocking=False).wait()
    out = deltackpt.load(repo_path)
    assert torch.equal(out["a"], w) and torch.equal(out["b"], w[2:5]) and out["empty"].shape == (0, 3)
    assert out["b"].untyped_storage().data_ptr() == out["a"].untyped_storage().data_ptr()
    assert out["cfg"] == {"lr": 0.1, "dims": (16, 4)}


def test_error_reraised_at_wait(repo_path, inject):
    """A background write that fails (injected ENOSPC on the pack) raises from wait() and commits nothing."""
    deltackpt.save(_model(), repo_path, step=1)
    inject("pack.write:1:enospc")
    h = deltackpt.save({"x": torch.randn(1000)}, repo_path, step=2, blocking=False)
    with pytest.raises(OSError, match="ENOSPC"):
        h.wait()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [1]


def test_unobserved_error_reraised_at_next_save(repo_path, inject):
    """When nobody waited for a failed background save, the next save raises its error and starts nothing."""
    deltackpt.save(_model(), repo_path, step=1)
    inject("pack.write:1:eio")
    deltackpt.save({"x": torch.randn(1000)}, repo_path, step=2, blocking=False)
    with pytest.raises(OSError, match="EIO"):
        deltackpt.save({"y": torch.randn(10)}, repo_path, step=3)
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [1]
    deltackpt.save({"y": torch.randn(10)}, repo_path, step=3)   # the error is reported once
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [3, 1]


def test_one_save_in_flight(repo_path, monkeypatch):
    """A second background save waits until the first has committed before it snapshots."""
    gate = threading.Event()
    started = threading.Event()
    from deltackpt.repo.write import saver
    real = saver.write_version

    def slow_first(*a, **k):
        if not started.is_set():
            started.set()
            assert gate.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(saver, "write_version", slow_first)
    m = _model()
    h1 = deltackpt.save(m, repo_path, step=1, blocking=False)
    assert started.wait(10) and not h1.done()
    threading.Timer(0.2, gate.set).start()
    h2 = deltackpt.save(m, repo_path, step=2, blocking=False)
    assert h1.done()        # the second call returned only after the first finished
    assert h2.wait().step == 2 and h1.wait().step == 1


def test_waiting_for_a_finished_save_does_not_wait_for_the_next(repo_path, monkeypatch):
    """A handle whose save has committed returns from wait() at once while the save thread writes
    a later save (a guard settling the saves it tracks at every step must not stall the loop)."""
    gate = threading.Event()
    second = threading.Event()
    from deltackpt.repo.write import saver
    real = saver.write_version

    def held_second(*a, **k):
        if k.get("step") == 2:
            second.set()
            assert gate.wait(30)
        return real(*a, **k)

    monkeypatch.setattr(saver, "write_version", held_second)
    m = _model()
    with deltackpt.Repo(repo_path, create=True) as repo:
        h1 = repo.save(m, step=1, blocking=False)
        h1.wait()
        h2 = repo.save(m, step=2, blocking=False)
        assert second.wait(10)
        returned = threading.Event()
        waiter = threading.Thread(target=lambda: (h1.wait(), returned.set()))
        waiter.start()
        try:
            assert returned.wait(10) and not h2.done()
        finally:
            gate.set()
            waiter.join()
        assert h2.wait().step == 2


def test_unchanged_chunks_are_not_written(repo_path):
    """Saving an unchanged state in the background writes no chunk: every chunk is found by its hash."""
    m = _model()
    v1 = deltackpt.save(m, repo_path, step=1, blocking=False).wait()
    v2 = deltackpt.save(m, repo_path, step=2, blocking=False).wait()
    shown = deltackpt.Repo(repo_path).show(v2.id)
    assert v1.written_bytes > 0 and v2.written_bytes == 0
    assert shown["written"]["chunks_new"] == 0 and shown["written"]["chunks_reused"] > 0


def test_one_set_of_staging_buffers_serves_every_save(repo_path):
    """A save's staging copy goes back to the handle's pool when the save is done, and the next
    save copies into it: one set of buffers however many saves (the delta cache copies out the few
    chunks it keeps), all of it freed when the handle closes."""
    m = _model()
    sets = []
    with deltackpt.Repo(repo_path, create=True) as repo:
        for step in range(4):
            with torch.no_grad():
                m[0].weight.add_(1e-3)
            h = repo.save(m.state_dict(), step=step, blocking=False)
            h.wait()
            sets.append(repo.runtime.staging.last_ids)
        assert len(set(sets)) == 1 and sets[0]
        assert repo.runtime.staging.free_bytes <= repo.runtime.options.max_in_flight * h.staged_bytes
        pool = repo.runtime.staging
    assert pool.free_bytes == 0


def test_background_nice_applies_to_save_thread_and_its_workers(repo_path):
    """With BackgroundOptions(nice=5), the save thread and the encoder threads it starts run niced
    below the caller."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def probe():
        with ThreadPoolExecutor(1) as p:
            return p.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()

    with deltackpt.Repo(repo_path, create=True, background=runtime.BackgroundOptions(nice=5)) as repo:
        assert repo.runtime.run(probe).result(30) == min(19, mine + 5)


def test_background_save_takes_only_the_cores_training_leaves(monkeypatch, tmp_path):
    """A background save encodes with the cores torch's intra-op threads leave free (at least one);
    an explicit ``workers`` wins, and a bad one is refused before anything is written."""
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    assert runtime.spare_cores() == 2
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert runtime.spare_cores() == 1
    with pytest.raises(deltackpt.DeltackptError, match="workers"):
        deltackpt.save({"w": torch.ones(2)}, tmp_path / "r", blocking=False, workers=0)
    assert not (tmp_path / "r").exists()
    h = deltackpt.save({"w": torch.ones(2)}, tmp_path / "r", blocking=False, workers=1)
    assert h.wait().logical_bytes == 8


def test_a_large_snapshot_is_copied_by_two_threads(repo_path, monkeypatch):
    """Above PARALLEL_COPY_BYTES, with cores the training threads leave free, the copies beyond the
    caller's share run on helper threads: every tensor on every side of the cuts (a shared storage
    included) is in the version, bit for bit, and a helper ran."""
    monkeypatch.setattr(host_copy, "PARALLEL_COPY_BYTES", 1)
    monkeypatch.setattr(host_copy.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(host_copy.torch, "get_num_threads", lambda: 1)
    copiers = set()
    real = host_copy._copy_list

    def copy_list(pairs):
        copiers.add(threading.current_thread().name)
        real(pairs)

    monkeypatch.setattr(host_copy, "_copy_list", copy_list)
    w = torch.randn(64, 64)
    state = {f"t{i}": torch.randn(1000 * (i + 1)) for i in range(6)}
    state.update({"w": w, "rows": w[10:20], "last": torch.arange(7, dtype=torch.int64)})
    v = deltackpt.save(state, repo_path, step=1, blocking=False).wait()
    assert "deltackpt-snapshot" in copiers                             # a helper thread ran
    loaded = deltackpt.load(repo_path, v.id)
    for k, t in state.items():
        assert torch.equal(loaded[k], t), k
    assert loaded["rows"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr()
