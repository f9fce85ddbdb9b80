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


def _assert_all_pinned(pool) -> None:
    """Every staging buffer of CUDA tensors is pinned: the slabs, and the buffers carved out of them
    (CUDA sees a pointer into a pinned block as pinned, so the device -> host copy is asynchronous)."""
    with pool._lock:
        sets = list(pool._slabs)
        plain = [b for bs in pool._buffers.values() for b in bs]
    assert sets and not plain
    for s in sets:
        assert s.pinned and all(slab.is_pinned() for slab in s.slabs)
        assert all(b.is_pinned() for b in s.buffers)


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
        _assert_all_pinned(repo.runtime.staging)
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
    _assert_all_pinned(pool)
    assert ckpt.repo.runtime._prefaults
    ckpt.close()


def test_cuda_pinned_staging_of_a_gpt2_sized_state_is_its_own_size(repo_path):
    """Stop 39 kept 1.66x a GPT-2 + AdamW state pinned (one power-of-two block per tensor).  A
    background save of GPT-2 small's weights on the GPU now stages into slabs that take under 1.05x
    the state, every buffer pinned, and the version is the state of the call."""
    torch.manual_seed(0)
    d, shapes = 768, {"wte": (50257, 768), "wpe": (1024, 768)}
    for i in range(12):
        shapes.update({f"h{i}.attn.w": (d, 3 * d), f"h{i}.attn.b": (3 * d,), f"h{i}.proj.w": (d, d),
                       f"h{i}.fc.w": (d, 4 * d), f"h{i}.fc.b": (4 * d,), f"h{i}.out.w": (4 * d, d),
                       f"h{i}.ln.w": (d,)})
    state = {k: torch.randn(s, device="cuda") for k, s in shapes.items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    expected = _cpu(state)
    with deltackpt.Repo(repo_path, create=True) as repo:
        v = repo.save(state, step=1, blocking=False).wait()
        pool = repo.runtime.staging
        _assert_all_pinned(pool)
        assert nbytes <= pool.free_bytes <= 1.05 * nbytes
    _assert_same(expected, deltackpt.load(repo_path, v.id))
