"""CUDA snapshots: device tensors stage into pinned host memory, a lazy copy runs on a side stream
and the optimizer's stream waits on its event.  Skipped without a GPU (not run on the project
machine, which has none)."""

from __future__ import annotations

import pytest
import torch

import deltackpt
from tests.conftest import drain_background

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _drained():
    yield
    drain_background()
    torch.cuda.synchronize()


def _setup(width: int = 2048, depth: int = 4):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width)]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device="cuda")

    def one_step() -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    return model, opt, one_step


def _cpu(obj):
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_cpu(v) for v in obj]
    return obj.detach().cpu().clone() if isinstance(obj, torch.Tensor) else obj


def _assert_same(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_cuda_lazy_version_is_the_state_at_the_call(repo_path):
    """A lazy save of a CUDA model and AdamW state, with optimizer steps queued right after it
    returns, stores the state at the call bit for bit (the step's kernels wait on the copy's event)."""
    model, opt, one_step = _setup()
    one_step()
    torch.cuda.synchronize()
    expected = _cpu({"model": model.state_dict(), "opt": opt.state_dict()})
    h = deltackpt.save({"model": model.state_dict(), "opt": opt.state_dict()}, repo_path, step=1,
                       blocking=False, optimizer=opt)
    assert h.lazy_bytes > 0
    for _ in range(3):
        one_step()
    v = h.wait()
    _assert_same(expected, deltackpt.load(repo_path, v.id))
    assert not torch.equal(model[0].weight.cpu(), expected["model"]["0.weight"])


def test_cuda_step_right_after_the_save_is_ordered_after_the_copy(repo_path):
    """opt.step() with no forward in between (the copy of ~270 MB certainly still queued): the
    saved weights are the old ones, the live ones moved."""
    model, opt, one_step = _setup(width=4096, depth=4)
    one_step()
    torch.cuda.synchronize()
    before = model[0].weight.detach().cpu().clone()
    h = deltackpt.save(model.state_dict(), repo_path, step=1, blocking=False, optimizer=opt)
    opt.step()
    torch.cuda.synchronize()
    assert not torch.equal(model[0].weight.cpu(), before)
    assert torch.equal(deltackpt.load(repo_path, h.wait().id)["0.weight"], before)


def test_cuda_eager_background_save_stages_into_pinned_memory(repo_path):
    """A plain background save of CUDA tensors copies them into pinned host buffers, fenced by a
    CUDA event, and the version holds the state of the call."""
    model, opt, one_step = _setup(width=512, depth=2)
    one_step()
    expected = _cpu(model.state_dict())
    with deltackpt.Repo(repo_path, create=True) as repo:
        h = repo.save(model.state_dict(), step=1, blocking=False)
        one_step()
        v = h.wait()
        assert all(b.is_pinned() for bs in repo.runtime.staging._buffers.values() for b in bs)
    _assert_same(expected, deltackpt.load(repo_path, v.id))


def test_cuda_prepare_pins_the_staging_ahead_of_the_first_save(repo_path):
    """Checkpointer.prepare on a CUDA state pools pinned buffers; the first save allocates none."""
    from deltackpt.training import Checkpointer
    model, opt, one_step = _setup(width=768, depth=2)
    one_step()
    ckpt = Checkpointer(repo_path, policy=1, snapshot="lazy", optimizer=opt)
    ckpt.prepare(model.state_dict()).join()
    pool = ckpt.repo.runtime.staging
    fresh = pool.fresh_bytes
    ckpt.step(model.state_dict(), step=1).wait()
    assert pool.fresh_bytes == fresh
    assert all(b.is_pinned() for bs in pool._buffers.values() for b in bs)
    assert ckpt.repo.runtime._prefaults
    ckpt.close()
