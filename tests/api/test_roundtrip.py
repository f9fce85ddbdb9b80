"""Lossless round trips through a real repository on disk."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import deltackpt
from tests.strategies import ALL_DTYPES, assert_bit_identical, raw_tensors, states


@given(state=states())
def test_nested_states_round_trip_bit_identical(tmp_path_factory, state):
    """Any nested state of tensors (all dtypes, views, shared storage) and plain leaves comes back bit-identical."""
    path = str(tmp_path_factory.mktemp("r") / "repo")
    deltackpt.save(state, path)
    assert_bit_identical(state, deltackpt.load(path))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_including_special_bytes(repo_path, dtype):
    """Every torch dtype keeps its exact bytes, 0-d and empty tensors included."""
    isz = torch.empty(0, dtype=dtype).element_size()
    pattern = bytes(range(256)) * 4
    t = torch.frombuffer(bytearray(pattern[: (len(pattern) // isz) * isz]), dtype=torch.uint8)
    if dtype == torch.bool:
        t = t & 1
    state = {"v": t.view(dtype), "scalar": t[:isz].view(dtype).reshape(()), "empty": torch.empty(0, 3, dtype=dtype)}
    deltackpt.save(state, repo_path)
    assert_bit_identical(state, deltackpt.load(repo_path))


def test_float_specials_keep_nan_payloads_negative_zero_and_subnormals(repo_path):
    """NaN payloads, -0.0, subnormals and infinities survive bit for bit in every float width."""
    bits32 = torch.tensor([0x7FC00001, 0xFFC12345, 0x80000000, 0x00000001, 0x7F800000, 0xFF800000, 0x007FFFFF],
                          dtype=torch.int64).to(torch.int32)
    state = {"f32": bits32.view(torch.float32),
             "f16": torch.tensor([0x7E01, 0x8000, 0x0001, 0xFC00], dtype=torch.int32).to(torch.int16).view(torch.float16),
             "bf16": torch.tensor([0x7FC1, 0x8000, 0x0001, 0xFF80], dtype=torch.int32).to(torch.int16).view(torch.bfloat16),
             "f64": torch.tensor([-0.0, 5e-324, math.inf], dtype=torch.float64)}
    deltackpt.save(state, repo_path)
    assert_bit_identical(state, deltackpt.load(repo_path))


def test_tied_weights_come_back_sharing_storage(repo_path):
    """Two state entries that are one tensor (tied embeddings) are stored once and load sharing storage."""
    emb = torch.randn(100, 16)
    state = {"embed.weight": emb, "lm_head.weight": emb, "view": emb[10:20, ::2]}
    v = deltackpt.save(state, repo_path)
    out = deltackpt.load(repo_path)
    assert_bit_identical(state, out)
    assert out["embed.weight"].untyped_storage().data_ptr() == out["lm_head.weight"].untyped_storage().data_ptr()
    assert out["view"].untyped_storage().data_ptr() == out["embed.weight"].untyped_storage().data_ptr()
    out["embed.weight"][0, 0] = 42.0
    assert out["lm_head.weight"][0, 0] == 42.0
    assert v.logical_bytes == emb.numel() * 4  # one blob for the shared storage


def test_non_contiguous_views_round_trip_as_values(repo_path):
    """Transposed and strided views that share no storage come back with equal values and shapes."""
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    state = {"t": base.t(), "s": torch.randn(8, 8)[::3, 1::2]}
    deltackpt.save(state, repo_path)
    assert_bit_identical(state, deltackpt.load(repo_path))


def test_real_adamw_state_with_scheduler_round_trips(repo_path):
    """A real model + AdamW + LR scheduler training state round-trips, with int keys and tuples intact."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    for _ in range(3):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        sched.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": 3}
    deltackpt.save(state, repo_path, step=3)
    out = deltackpt.load(repo_path)
    assert_bit_identical({**state, "model": dict(state["model"])}, {**out, "model": dict(out["model"])})
    assert out["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)


@settings(max_examples=25)
@given(t=raw_tensors(), chunk=st.sampled_from([1, 3, 64, 4096]))
def test_any_chunk_size_reassembles_exactly(tmp_path_factory, t, chunk):
    """Cutting tensors into chunks of any size (rows or elements) reassembles the exact bytes."""
    path = str(tmp_path_factory.mktemp("r") / "repo")
    deltackpt.Repo(path, create=True, chunk_bytes=chunk)
    deltackpt.save({"t": t}, path)
    assert_bit_identical({"t": t}, deltackpt.load(path))


def test_map_location_moves_tensors_and_keeps_sharing(repo_path):
    """map_location='meta' style moves are honoured for CPU targets and sharing survives the move."""
    emb = torch.randn(4, 4)
    deltackpt.save({"a": emb, "b": emb}, repo_path)
    out = deltackpt.load(repo_path, map_location="cpu")
    assert out["a"].device.type == "cpu" and out["a"].untyped_storage().data_ptr() == out["b"].untyped_storage().data_ptr()


def test_a_refused_first_save_creates_no_repository(tmp_path):
    """A save refused for its input (unsupported leaf, bad tag, bad encoding) leaves no repository behind."""
    import os
    import pytest
    path = str(tmp_path / "new")
    for kwargs, state in (({}, {"x": {1, 2}}), ({"tag": "a/b"}, {"x": torch.ones(1)}),
                          ({"encoding": "q3"}, {"x": torch.ones(1)})):
        with pytest.raises(deltackpt.DeltackptError):
            deltackpt.save(state, path, **kwargs)
        assert not os.path.exists(path)


def test_load_packs_small_tensors_into_shared_aligned_buffers(tmp_path):
    """A full load gives small tensors 64-byte-aligned, non-overlapping slices of shared buffers of at
    most ARENA_BYTES (fewer page faults), big tensors their own buffer, and every tensor its bytes."""
    import numpy as np

    from deltackpt.torchstate import materialize
    torch.manual_seed(0)
    state = {f"small{i}": torch.randn(1000 + i) for i in range(40)}
    state["big"] = torch.randn(materialize.ARENA_BYTES // 4)
    path = str(tmp_path / "repo")
    deltackpt.save(state, path)
    got = deltackpt.load(path)
    for k, v in state.items():
        assert torch.equal(got[k], v)
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * 4) for k, t in got.items() if k != "big")
    assert all(a % 64 == 0 for a, _ in spans)
    assert all(e <= a for (_, e), (a, _) in zip(spans, spans[1:]))  # no overlap
    packed = sum(1 for (_, e), (a, _) in zip(spans, spans[1:]) if a - e < 64)   # back to back in one buffer
    assert packed > 0  # shared
    sizes = dict(enumerate([10, 100, materialize.ARENA_BYTES, 7] * 30))
    for i, b in materialize._buffers(sizes).items():
        assert b.nbytes == sizes[i]
        if isinstance(b.base, np.ndarray):  # a slice of a shared buffer
            assert sizes[i] < materialize.ARENA_BYTES and b.base.nbytes <= materialize.ARENA_BYTES + 64
        else:  # a buffer of its own, from torch's allocator
            assert isinstance(b.base, torch.Tensor) and b.base.nbytes == sizes[i]


def test_version_returned_by_save_equals_the_one_read_back(repo_path):
    """save() builds its Version from the manifest it committed; it matches a fresh read of it."""
    v = deltackpt.save({"w": torch.randn(3, 4), "t": (1, "a"), "n": [2.5, None]}, repo_path, step=7,
                       metrics={"loss": 0.5}, meta={"run": ("x", 1), "k": [1, 2]}, tag="first")
    fresh = deltackpt.Repo(repo_path).core
    fresh.forget_manifest(v.id)
    assert fresh.version(v.id) == v


def test_expanded_views_are_stored_as_their_storage_not_every_element(repo_path):
    """A stride-0 view (4 bytes expanded to 2^40 elements) saves its storage and strides instead of
    materializing 4 TiB, and loads back as the same view with the same values."""
    one = torch.tensor([1.5])
    rows = torch.arange(3.0)
    deltackpt.save({"w": one.expand(2**40), "e": rows.expand(4, 3)}, repo_path)
    state = deltackpt.load(repo_path)
    assert state["w"].shape == (2**40,) and state["w"].stride() == (0,)
    assert state["w"].untyped_storage().nbytes() == 4 and state["w"][2**40 - 1].item() == 1.5
    assert state["e"].stride() == (0, 1) and torch.equal(state["e"], rows.expand(4, 3))
    assert deltackpt.Repo(repo_path).verify().ok
