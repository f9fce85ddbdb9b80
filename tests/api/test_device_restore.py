"""Restoring onto a device: blobs decode, a window of chunks at a time, into a host buffer whose
bytes are then copied into the destinations (the GPU path; on this machine with CPU destinations
and unpinned buffers, so the windows, the split tensors and the errors are checked without a GPU).
The CUDA runs are in tests/snapshot/test_lazy_cuda.py and tests/scale/test_large_state.py."""

from __future__ import annotations

import os

import pytest
import torch

import deltackpt
from deltackpt.errors import CorruptObjectError
from deltackpt.torchstate.to_device import copy_blobs_to_device, read_blobs_to_device

CHUNK = 16 << 10


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    odd = torch.tensor([float("nan"), -0.0, 5e-324, float("-inf")], dtype=torch.float64)
    odd = torch.cat([odd, torch.randn(5000, generator=g, dtype=torch.float64)])
    odd.view(torch.int64)[0] = 0x7FF0_0000_DEAD_BEEF   # a NaN with a payload
    return {"big": torch.randn(300, 400, generator=g).to(torch.bfloat16),   # 15 chunks
            "odd": odd, "small": torch.arange(7, dtype=torch.int8),
            "mask": torch.rand(1000, generator=g) > 0.5,
            "z": torch.randn(900, generator=g, dtype=torch.complex64), "empty": torch.empty(0, 3)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "r")
    deltackpt.Repo(path, create=True, chunk_bytes=CHUNK)
    state = _state()
    v = deltackpt.save(state, path)
    core = deltackpt.Repo(path).core
    return path, state, core, v.id, core.manifest(v.id)


@pytest.mark.parametrize("window", [CHUNK, 3 * CHUNK + 100, 64 << 20])
def test_windows_fill_every_destination_bit_for_bit(saved, window):
    """Windows of one chunk, of a few chunks cutting tensors apart, and one window for all: every
    byte lands where it belongs (NaN payloads, -0.0 and subnormals included)."""
    _path, state, core, vid, m = saved
    targets = [(m.tensors[i].blob, torch.full_like(state[e.name], 1) if state[e.name].numel() else
                torch.empty_like(state[e.name])) for i, e in enumerate(m.tensors)]
    copy_blobs_to_device(core, vid, m, targets, pin=False, window=window, threads=2)
    for (_, dst), e in zip(targets, m.tensors):
        assert torch.equal(_bits(dst), _bits(state[e.name])), e.name


def test_fresh_device_buffers_build_the_saved_tensors(saved):
    _path, state, core, vid, m = saved
    from deltackpt.torchstate.materialize import build_tensors
    buffers = read_blobs_to_device(core, vid, m, [e.blob for e in m.tensors], "cpu")
    built = build_tensors(m, range(len(m.tensors)), buffers)
    for i, e in enumerate(m.tensors):
        assert built[i].dtype == state[e.name].dtype and built[i].shape == state[e.name].shape
        assert torch.equal(_bits(built[i]), _bits(state[e.name])), e.name


def test_a_wrong_destination_is_refused_before_anything_is_written(saved):
    _path, state, core, vid, m = saved
    big = next(i for i, e in enumerate(m.tensors) if e.name == "big")
    small = next(i for i, e in enumerate(m.tensors) if e.name == "small")
    untouched = torch.zeros(7, dtype=torch.int8)
    with pytest.raises(ValueError, match="holds 3 bytes"):
        copy_blobs_to_device(core, vid, m, [(m.tensors[small].blob, untouched),
                                            (m.tensors[big].blob, torch.zeros(3, dtype=torch.int8))], pin=False)
    with pytest.raises(ValueError, match="not contiguous"):
        copy_blobs_to_device(core, vid, m, [(m.tensors[small].blob, untouched),
                                            (m.tensors[big].blob, torch.zeros(400, 300, dtype=torch.bfloat16).t())],
                             pin=False)
    assert not untouched.any()


def test_a_damaged_chunk_names_the_version_and_tensor(saved):
    path, state, core, vid, m = saved
    packs = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(path, "packs")) for f in fs]
    target = max(packs, key=os.path.getsize)
    with open(target, "r+b") as f:   # a byte in the middle of the biggest pack: inside some chunk
        f.seek(os.path.getsize(target) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
    core = deltackpt.Repo(path).core
    targets = [(e.blob, torch.empty_like(state[e.name])) for e in m.tensors if state[e.name].numel()]
    with pytest.raises(CorruptObjectError, match=rf"version {vid[:10]}, tensor (big|odd|mask|z|small)"):
        copy_blobs_to_device(core, vid, m, targets, pin=False, window=2 * CHUNK)


def test_load_onto_a_device_goes_through_the_windows(saved, monkeypatch):
    """``load(map_location="cpu")`` keeps the host path; a GPU's ``map_location`` takes the
    windows, one pass for every blob, and returns the saved state on the device."""
    path, state, core, vid, m = saved
    import deltackpt.torchstate.to_device as to_device
    calls = []
    real = to_device.copy_blobs_to_device

    def counted(*a, **kw):
        calls.append(len(a[3]))
        return real(*a, **kw)

    monkeypatch.setattr(to_device, "copy_blobs_to_device", counted)
    loaded = deltackpt.load(path, map_location="cpu")
    assert not calls   # the CPU keeps its own path
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: load(map_location='cuda') is run by the CUDA tests")
    loaded = deltackpt.load(path, map_location="cuda")
    assert calls == [len({e.blob for e in m.tensors})]
    for k, t in state.items():
        assert loaded[k].is_cuda and torch.equal(_bits(loaded[k].cpu()), _bits(t)), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_windows_reuse_pinned_buffers_in_order(saved):
    """Many one-chunk windows through two pinned buffers: a buffer is decoded into again only after
    its bytes reached the GPU, the copies run after the kernels queued before the call (the fill)
    and before the ones queued after it (the clone)."""
    _path, state, core, vid, m = saved
    targets = [(e.blob, torch.empty_like(state[e.name], device="cuda")) for e in m.tensors]
    for _, dst in targets:
        if dst.numel():
            _bits(dst).fill_(0xAB)
    copy_blobs_to_device(core, vid, m, targets, window=CHUNK)
    after = [dst.clone() for _, dst in targets]
    for t, e in zip(after, m.tensors):
        assert torch.equal(_bits(t).cpu(), _bits(state[e.name])), e.name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_restore_writes_the_optimizer_state_where_it_lives(tmp_path):
    """Restoring a GPU model and its AdamW state decodes the moments into the optimizer's own GPU
    tensors (no host copy of them, no new device tensors) and gives back the saved bits."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        model(torch.randn(16, 256, device="cuda")).pow(2).mean().backward()
        opt.step()

    step()
    path = str(tmp_path / "r")
    deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    saved = {k: v.clone() for k, v in opt.state[model[0].weight].items()}
    where = {k: v.data_ptr() for k, v in opt.state[model[0].weight].items() if v.is_cuda}
    step()
    deltackpt.restore(model, path, optimizer=opt)
    now = opt.state[model[0].weight]
    assert where and {k: now[k].data_ptr() for k in where} == where
    for k, v in saved.items():
        assert torch.equal(now[k], v), k


@pytest.mark.parametrize("where", ["gpu", "cuda:99", 5.5])
def test_a_device_this_process_lacks_is_refused_before_anything_is_read(saved, where):
    """One typed line naming the argument, before the repository is opened (its packs are gone
    here: a read would fail differently)."""
    from deltackpt.errors import InvalidArgumentError
    path, *_ = saved
    import shutil
    shutil.rmtree(os.path.join(path, "packs"))
    with pytest.raises(InvalidArgumentError, match=r"map_location=.* is not a device here"):
        deltackpt.load(path, map_location=where)
