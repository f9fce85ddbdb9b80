"""Staging memory ahead of the save: ``Checkpointer.prepare`` and the first save of a new layout
fault in the copies later saves take, and a large snapshot is cut across copy threads."""

from __future__ import annotations

import threading

import pytest
import torch

import deltackpt
from tests.conftest import drain_background
from deltackpt.snapshot import host_copy
from deltackpt.training import Checkpointer


@pytest.fixture(autouse=True)
def _drained():
    yield
    drain_background()


def _state(seed: int, rows: int) -> dict:
    """Shapes no other test uses, so the staging pool's per-shape buffers are this test's own."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, 24, generator=g)
    return {"w": w, "tied": w[2:5], "b": torch.randn(rows + 1, generator=g).to(torch.bfloat16), "step": seed}


def _pool_ids(repo) -> set[int]:
    pool = repo.runtime.staging
    with pool._lock:
        return {id(t) for ts in pool._buffers.values() for t in ts}


def _used_ids(repo) -> set[int]:
    return set(repo.runtime.staging.last_ids)


def _settle_prefault(repo) -> None:
    """Wait for the handle's pre-faults started so far."""
    for t in list(repo.runtime._prefaults.values()):
        t.join()


def test_prepare_faults_in_every_copy_the_saves_then_take(repo_path):
    """After Checkpointer.prepare(state), the first saves allocate no staging memory: they take the
    max_in_flight copies prepare faulted in, and keep reusing them."""
    ckpt = Checkpointer(repo_path, policy=1)
    thread = ckpt.prepare(_state(0, 97))
    assert thread is not None
    thread.join()
    prepared = _pool_ids(ckpt.repo)
    fresh = ckpt.repo.runtime.staging.fresh_bytes
    used = []
    for step in range(1, 5):
        ckpt.step(_state(step, 97), step=step).wait()
        used.append(_used_ids(ckpt.repo))
    assert ckpt.repo.runtime.staging.fresh_bytes == fresh      # nothing allocated on a save's path
    assert all(u <= prepared for u in used) and used[0] == used[1] == used[3]
    assert ckpt.prepare(_state(9, 97)) is thread               # once per layout
    ckpt.close()


def test_first_save_of_a_new_layout_prefaults_the_next_copy(repo_path):
    """Without prepare, the first background save of a layout allocates its staging copy, which
    goes back to the pool when it is done: the second and later saves allocate nothing."""
    with deltackpt.Repo(repo_path, create=True) as repo:
        repo.save(_state(1, 131), step=1, blocking=False).wait()
        _settle_prefault(repo)
        fresh = repo.runtime.staging.fresh_bytes
        used = [_used_ids(repo)]
        for step in range(2, 5):
            repo.save(_state(step, 131), step=step, blocking=False).wait()
            used.append(_used_ids(repo))
        assert repo.runtime.staging.fresh_bytes == fresh
    assert used[0] and used[0] == used[1] == used[2] == used[3]


def test_prepare_for_the_encoder_process_pools_a_faulted_segment(repo_path, monkeypatch):
    """With background="process", prepare faults in shared segments, and the first save stages
    into one of them instead of creating its own."""
    from deltackpt.repo.write import encoder_process
    if not encoder_process.supported():
        pytest.skip("no encoder process on this platform")
    ckpt = Checkpointer(repo_path, policy=1, background="process")
    ckpt.prepare(_state(0, 157)).join()
    pool = ckpt.repo.runtime.staging
    with pool._lock:
        prepared = {s.id for s in pool._segments}
    fresh = pool.fresh_bytes
    ckpt.step(_state(1, 157), step=1).wait()
    assert pool.last_ids <= prepared
    assert pool.fresh_bytes == fresh
    ckpt.close()


def test_one_large_tensor_is_copied_by_several_threads(repo_path, monkeypatch):
    """Above PARALLEL_COPY_BYTES a snapshot is cut into one share per free core (4 here), a single
    large tensor into flat slices: helper threads copy some, and the version holds it bit for bit."""
    monkeypatch.setattr(host_copy, "PARALLEL_COPY_BYTES", 1)
    monkeypatch.setattr(host_copy.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(host_copy.torch, "get_num_threads", lambda: 1)
    copied_by: list[str] = []
    real = host_copy._copy_list

    def recording(pairs):
        copied_by.append(threading.current_thread().name)
        real(pairs)

    monkeypatch.setattr(host_copy, "_copy_list", recording)
    big = torch.randn(3, 40_001)
    v = deltackpt.save({"big": big, "small": torch.arange(5)}, repo_path, step=1, blocking=False).wait()
    assert len(copied_by) == 4 and len(set(copied_by)) >= 2   # four shares, helpers took some
    out = deltackpt.load(repo_path, v.id)
    assert torch.equal(out["big"], big) and torch.equal(out["small"], torch.arange(5))


def test_split_covers_every_byte_once():
    """_split's shares, concatenated, are exactly the input pairs' bytes in order (slices of
    contiguous tensors, non-contiguous sources whole)."""
    a, b, c = torch.arange(1000.0), torch.arange(10.0).reshape(2, 5).t(), torch.arange(333, dtype=torch.int16)
    pairs = [(torch.empty_like(a), a), (torch.empty(5, 2), b), (torch.empty_like(c), c)]
    shares = host_copy._split(pairs, 3)
    assert 2 <= len(shares) <= 4
    for share in shares:
        host_copy._copy_list(share)
    assert all(torch.equal(d, s) for d, s in pairs)
    assert sum(d.numel() * d.element_size() for share in shares for d, _ in share) == sum(
        d.numel() * d.element_size() for d, _ in pairs)


def test_checkpointer_prepares_at_its_first_step(repo_path):
    """The first Checkpointer.step given a state (a dict, no save due yet) starts the pre-fault:
    the first save, steps later, allocates no staging memory."""
    ckpt = Checkpointer(repo_path, policy=3)
    assert ckpt.step(_state(1, 173), step=1) is None
    _settle_prefault(ckpt.repo)
    fresh = ckpt.repo.runtime.staging.fresh_bytes
    assert ckpt.step(_state(2, 173), step=2) is None
    ckpt.step(_state(3, 173), step=3).wait()
    assert ckpt.repo.runtime.staging.fresh_bytes == fresh
    ckpt.close()
    ckpt.close()
