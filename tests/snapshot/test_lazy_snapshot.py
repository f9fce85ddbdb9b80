"""Lazy snapshots (``save(..., blocking=False, optimizer=opt)``, ``Checkpointer(snapshot="lazy")``):
the optimizer's tensors are copied after the call returns, and ``opt.step()`` waits for the copy.

Every test widens the copy's window with the project's fault hook (``snapshot.lazy_copy:N:sleepX``
makes the copy thread sleep before it copies), so training provably runs while the copy has not
happened yet: without the step pre-hook the saved version would hold post-step values."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import deltackpt
from deltackpt import faults
from deltackpt.training import Checkpointer, training_state
from tests.strategies import assert_bit_identical, clone_state
from torch.optim.optimizer import register_optimizer_step_pre_hook


@pytest.fixture
def slow_copy(inject):
    """Make the Nth lazy copy sleep before copying."""
    def arm(seconds: float = 0.5, nth: int = 1) -> None:
        inject(f"snapshot.lazy_copy:{nth}:sleep{seconds}")
    return arm


class _Net(torch.nn.Module):
    """Dense layers, a BatchNorm (buffers forward mutates) and an optional sparse embedding."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16, sparse=sparse)
        self.fc = torch.nn.Linear(16, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.out = torch.nn.Linear(32, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.fc(self.emb(ids)))))


def _setup(kind: str):
    """(model, optimizers, scaler or None, one_step) for an optimizer kind."""
    torch.manual_seed(0)
    model = _Net(sparse=kind == "sparseadam")
    scaler = None
    if kind == "adamw":
        opts = [torch.optim.AdamW(model.parameters(), lr=1e-2)]
    elif kind == "sgd-momentum":
        opts = [torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)]
    elif kind == "sparseadam":
        dense = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
        opts = [torch.optim.SparseAdam(model.emb.parameters(), lr=1e-2), torch.optim.Adam(dense, lr=1e-2)]
    else:   # gradscaler: AdamW under CPU autocast with a loss scaler
        opts = [torch.optim.AdamW(model.parameters(), lr=1e-2)]
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=1)
    gen = torch.Generator().manual_seed(1)

    def one_step() -> None:
        ids = torch.randint(0, 50, (8,), generator=gen)
        target = torch.randn(8, 4, generator=gen)
        for o in opts:
            o.zero_grad()
        if scaler is not None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = (model(ids).float() - target).pow(2).mean()
            scaler.scale(loss).backward()
            for o in opts:
                scaler.step(o)
            scaler.update()
        else:
            loss = (model(ids) - target).pow(2).mean()
            loss.backward()
            for o in opts:
                o.step()

    return model, opts, scaler, one_step


def _state(model, opts, scaler, step):
    return {"model": model.state_dict(), "optimizers": [o.state_dict() for o in opts],
            "scaler": scaler.state_dict() if scaler is not None else None, "step": step}


@pytest.mark.parametrize("kind", ["adamw", "sgd-momentum", "sparseadam", "gradscaler"])
def test_lazy_version_is_the_state_at_the_call_while_training_goes_on(repo_path, slow_copy, kind):
    """A lazily saved version is bit-identical to the state when save() returned, although real
    training steps (forward, backward, optimizer and scaler steps) run right after it, while the
    copy of the optimizer's tensors has not started yet."""
    model, opts, scaler, one_step = _setup(kind)
    for _ in range(2):   # the optimizer state exists (it is created at the first step)
        one_step()
    expected = clone_state(_state(model, opts, scaler, 2))
    slow_copy(0.5)
    h = deltackpt.save(_state(model, opts, scaler, 2), repo_path, step=2, blocking=False, optimizer=opts)
    assert h.lazy_bytes > 0
    for _ in range(3):
        one_step()
    v = h.wait()
    assert_bit_identical(expected, deltackpt.load(repo_path, v.id))
    live = _state(model, opts, scaler, 2)
    assert not torch.equal(live["model"]["fc.weight"], expected["model"]["fc.weight"])   # training did move on
    assert not torch.equal(live["model"]["bn.running_mean"], expected["model"]["bn.running_mean"])


def test_optimizer_step_waits_for_the_copy(repo_path, monkeypatch):
    """opt.step() right after a lazy save blocks until the copy is done.  The copy is held at its
    start until the step begins (a global step pre-hook, which torch runs before the optimizer's
    own, opens the gate, and the copy then sleeps 0.3 s more), so forward and backward provably ran
    before it; after step() the snapshot is complete, the saved weights are the old ones and the
    live ones have moved.  (A slow machine can only make a step that does not wait pass.)"""
    gate = threading.Event()
    real_hit = faults.hit

    def gated(site: str):
        if site == "snapshot.lazy_copy":
            assert gate.wait(60), "the step never started"
            time.sleep(0.3)   # a step that did not wait would have written by now
        return real_hit(site)

    monkeypatch.setattr(faults, "hit", gated)
    model, (opt,), _, one_step = _setup("adamw")
    one_step()
    before = model.fc.weight.detach().clone()
    h = deltackpt.save({"model": model.state_dict(), "opt": opt.state_dict()}, repo_path, step=1,
                       blocking=False, optimizer=opt)
    ids = torch.randint(0, 50, (8,))
    model(ids).pow(2).mean().backward()     # forward and backward run while the copy is held
    assert not h.snapshot_done()
    opener = register_optimizer_step_pre_hook(lambda *a: gate.set())
    try:
        opt.step()
    finally:
        opener.remove()
    assert h.snapshot_done()                # step() returned only after the copy had finished
    assert not torch.equal(model.fc.weight, before)
    assert torch.equal(deltackpt.load(repo_path, h.wait().id)["model"]["fc.weight"], before)


def test_hooks_are_removed_once_the_copy_is_done(repo_path):
    """The step pre-hook goes after the first step that follows the copy, and every hook at the
    next save or wait_snapshot(): a loop saving lazily does not pile hooks on its optimizer."""
    model, (opt,), _, one_step = _setup("adamw")
    one_step()
    for step in range(3):
        h = deltackpt.save(model.state_dict(), repo_path, step=step, blocking=False, optimizer=opt)
        one_step()
        assert len(opt._optimizer_step_pre_hooks) == 0
        assert len(opt._optimizer_step_post_hooks) <= 1
    h.wait_snapshot()
    assert len(opt._optimizer_step_pre_hooks) == 0 and len(opt._optimizer_step_post_hooks) == 0
    h.wait()


def test_wait_snapshot_makes_an_outside_write_safe(repo_path, slow_copy):
    """An in-place write outside optimizer.step() (here an EMA-style ``p.mul_()``) after
    ``handle.wait_snapshot()`` does not reach the saved version."""
    model, (opt,), _, one_step = _setup("sgd-momentum")
    one_step()
    before = model.out.weight.detach().clone()
    slow_copy(0.3)
    h = deltackpt.save(model.state_dict(), repo_path, step=1, blocking=False, optimizer=opt)
    h.wait_snapshot()
    assert h.snapshot_done()
    with torch.no_grad():
        model.out.weight.mul_(0.5)
    assert torch.equal(deltackpt.load(repo_path, h.wait().id)["out.weight"], before)


def test_tensors_outside_the_optimizer_are_copied_at_the_call(repo_path, slow_copy):
    """Only tensors the optimizer owns are deferred: a frozen parameter, a buffer and a plain
    extra tensor are in the snapshot before save() returns (lazy_bytes counts only the rest)."""
    model, (opt,), _, one_step = _setup("adamw")
    one_step()
    frozen = torch.nn.Parameter(torch.randn(64), requires_grad=False)   # not in the optimizer
    extra = torch.arange(10.0)
    slow_copy(0.3)
    state = {"model": model.state_dict(), "frozen": frozen, "extra": extra, "opt": opt.state_dict()}
    expected = clone_state(state)
    h = deltackpt.save(state, repo_path, step=1, blocking=False, optimizer=opt)
    with torch.no_grad():
        frozen.add_(1.0)
        extra.add_(1.0)
        model.bn.running_var.add_(1.0)
    one_step()
    assert_bit_identical(expected, deltackpt.load(repo_path, h.wait().id))
    owned = sum(p.numel() * 4 for p in model.parameters()) + sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    assert h.lazy_bytes == owned


def test_checkpointer_lazy_saves_every_step_bit_identical(repo_path, slow_copy):
    """Checkpointer(snapshot="lazy", optimizer=opt) saving at every step of a real loop: each
    version equals the training state at its step."""
    model, (opt,), _, one_step = _setup("adamw")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)   # wraps opt.step
    one_step()
    slow_copy(0.2, nth=2)
    ckpt = Checkpointer(repo_path, policy=1, snapshot="lazy", optimizer=opt)
    expected = {}
    for step in range(1, 5):
        state = training_state(model=model, optimizer=opt, scheduler=sched, step=step, capture_rng=False)
        expected[step] = clone_state(state)
        ckpt.step(state, step=step)
        one_step()
        sched.step()
    ckpt.close()
    by_step = {v.step: v.id for v in deltackpt.Repo(repo_path).log()}
    for step, state in expected.items():
        assert_bit_identical(state, deltackpt.load(repo_path, by_step[step]), f"step {step}")


def test_bad_lazy_arguments_are_refused_before_anything_is_written(tmp_path):
    """optimizer= must be an optimizer (or a list of them), snapshot= must be eager or lazy, and
    lazy needs an optimizer: refused with typed errors, no repository created by save()."""
    path = tmp_path / "r"
    with pytest.raises(deltackpt.UnsupportedLeafError, match="optimizer"):
        deltackpt.save({"w": torch.ones(2)}, path, blocking=False, optimizer=object())
    assert not path.exists()
    with pytest.raises(deltackpt.DeltackptError, match="snapshot"):
        Checkpointer(tmp_path / "c", snapshot="sometimes")
    with pytest.raises(deltackpt.DeltackptError, match="optimizer"):
        Checkpointer(tmp_path / "c", snapshot="lazy")


def test_lazy_save_through_the_encoder_process(repo_path, slow_copy, monkeypatch):
    """background="process": the lazy copy goes into the shared segment before the encoder process
    reads it, and the version is the state at the call."""
    from deltackpt.repo.write import encoder_process
    if not encoder_process.supported():
        pytest.skip("no encoder process on this platform")
    model, (opt,), _, one_step = _setup("adamw")
    one_step()
    expected = clone_state({"model": model.state_dict(), "opt": opt.state_dict()})
    slow_copy(0.3)
    with deltackpt.Repo(repo_path, create=True) as repo:
        h = repo.save({"model": model.state_dict(), "opt": opt.state_dict()}, step=1,
                      blocking=False, optimizer=opt, background="process")
        one_step()
        assert_bit_identical(expected, deltackpt.load(repo_path, h.wait().id))
        assert repo.runtime.staging._segments   # staged into a shared segment, pooled again


def test_a_failed_lazy_copy_fails_the_save_not_the_training_step(repo_path, inject):
    """An error in the lazy copy (injected EIO) is raised by handle.wait() and commits nothing;
    optimizer.step() itself goes on, and the next save works."""
    inject("snapshot.lazy_copy:1:eio")
    model, (opt,), _, one_step = _setup("adamw")
    one_step()
    deltackpt.save(model.state_dict(), repo_path, step=0)
    h = deltackpt.save(model.state_dict(), repo_path, step=1, blocking=False, optimizer=opt)
    one_step()
    with pytest.raises(OSError, match="injected EIO"):
        h.wait()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [0]
    expected = clone_state(model.state_dict())
    v = deltackpt.save(model.state_dict(), repo_path, step=2, blocking=False, optimizer=opt).wait()
    assert_bit_identical(expected, deltackpt.load(repo_path, v.id))


def test_restore_into_the_model_waits_for_a_pending_lazy_copy(tmp_path, slow_copy):
    """deltackpt.restore writes into the live parameters, so it first waits for every pending lazy
    copy: a lazy save to one repository keeps the weights of the call even when the model is
    restored from another repository right after."""
    model, (opt,), _, one_step = _setup("adamw")
    other = str(tmp_path / "other")
    deltackpt.save(model.state_dict(), other, step=0)       # the weights restore will bring back
    one_step()
    expected = clone_state(model.state_dict())
    slow_copy(0.5)
    h = deltackpt.save(model.state_dict(), str(tmp_path / "main"), step=1, blocking=False, optimizer=opt)
    deltackpt.restore(model, other)
    assert not torch.equal(model.fc.weight, expected["fc.weight"])
    assert_bit_identical(expected, deltackpt.load(str(tmp_path / "main"), h.wait().id))


def test_resume_from_another_repository_waits_for_a_pending_lazy_copy(tmp_path, slow_copy):
    """resume() loads into the live model and optimizer, so it waits for every pending lazy copy,
    not only its own repository's: the lazy save keeps the state of the call."""
    from deltackpt.training import resume, training_state
    model, (opt,), _, one_step = _setup("adamw")
    other = str(tmp_path / "other")
    deltackpt.save(training_state(model=model, optimizer=opt, step=0), other, step=0)
    one_step()
    expected = clone_state(model.state_dict())
    slow_copy(0.5)
    h = deltackpt.save(model.state_dict(), str(tmp_path / "main"), step=1, blocking=False, optimizer=opt)
    resume(other, model=model, optimizer=opt)
    assert not torch.equal(model.fc.weight, expected["fc.weight"])
    assert_bit_identical(expected, deltackpt.load(str(tmp_path / "main"), h.wait().id))
