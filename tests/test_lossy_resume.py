"""Training resumed 10 times from lossy (q8/q4 block-quantized delta) versions ends within 1% of the
loss of uninterrupted training: quantization error does not accumulate along the chain.  The modes
store the decaying optimizer moments mostly with the scaled variants (encodings 10, 11), so these
runs cover both those and the plain ones."""

from __future__ import annotations

import pytest
import torch

import deltackpt
from deltackpt.codecs.registry import Q4_SCALED_DELTA, Q8_SCALED_DELTA


def _setup(seed: int, width: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                torch.nn.GELU(), torch.nn.Linear(width, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    return model, opt


def _batch(step: int, teacher: torch.Tensor):
    """The batch of a step depends only on the step, so interrupted and uninterrupted runs see the same data."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(128, 32, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def _train(model, opt, steps: range, teacher) -> list[float]:
    losses = []
    for s in steps:
        x, y = _batch(s, teacher)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _final_loss(losses: list[float], window: int) -> float:
    return sum(losses[-window:]) / window


@pytest.mark.parametrize("encoding", [
    {"optimizer.*": "q8-delta"},
    pytest.param({"optimizer.*": "q8-delta", "model.*": "q8-delta"}, marks=pytest.mark.slow),
], ids=["q8-optimizer", "q8-everything"])
def test_resuming_ten_times_from_q8_versions_keeps_the_loss(repo_path, encoding):
    """10 kill-and-resume cycles from q8-delta versions end within 1% of uninterrupted training."""
    resumes, every = 10, 10
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(7))
    model, opt = _setup(0, 64)
    total = range(1 + (resumes + 1) * every)
    baseline = _train(model, opt, total, teacher)
    used, resumed, inexact = _resume_run(repo_path, encoding, resumes, every, 64, teacher)
    assert inexact == resumes  # every restore was from a lossy version
    assert Q8_SCALED_DELTA in used
    base_loss, res_loss = _final_loss(baseline, every), _final_loss(resumed, every)
    assert base_loss < 0.5 * _final_loss(baseline[:every], every)  # it did learn
    assert abs(res_loss - base_loss) <= 0.01 * base_loss, (res_loss, base_loss)


@pytest.mark.slow
def test_resuming_ten_times_from_q4_versions_of_a_wider_model_keeps_the_loss(repo_path):
    """The same with int4 optimizer deltas and a wider model trained longer between resumes."""
    resumes, every = 10, 60
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(7))
    model, opt = _setup(0, 256)
    baseline = _train(model, opt, range(1 + (resumes + 1) * every), teacher)
    used, resumed, inexact = _resume_run(repo_path, {"optimizer.*": "q4-delta"}, resumes, every, 256, teacher)
    assert inexact == resumes and Q4_SCALED_DELTA in used
    base_loss, res_loss = _final_loss(baseline, every), _final_loss(resumed, every)
    assert abs(res_loss - base_loss) <= 0.01 * base_loss, (res_loss, base_loss)


def _resume_run(repo_path, encoding, resumes, every, width, teacher):
    deltackpt.Repo.init(repo_path, keyframe_interval=16)  # one chain: every resume is from a lossy delta
    model, opt = _setup(0, width)
    resumed = _train(model, opt, range(1), teacher)  # one step, so the optimizer has moments to quantize
    deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, repo_path, step=0,
                   encoding=encoding)  # the keyframe (exact: a quantized delta needs a base)
    inexact = 0
    for r in range(resumes):
        resumed += _train(model, opt, range(1 + r * every, 1 + (r + 1) * every), teacher)
        deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, repo_path,
                       step=(r + 1) * every, encoding=encoding)
        # "kill" the trainer: a new model and optimizer, differently initialised, get everything
        # from the repository (the repository handle, and so its delta cache, stays open)
        del model, opt
        model, opt = _setup(r + 1, width)
        _, version = deltackpt.load(repo_path, return_version=True)
        inexact += not version.exact
        deltackpt.restore(model, repo_path, "latest", optimizer=opt)
    resumed += _train(model, opt, range(1 + resumes * every, 1 + (resumes + 1) * every), teacher)
    used = {e.encoding for _cid, _pid, e in deltackpt.Repo(repo_path).core.index.items()}
    return used, resumed, inexact
