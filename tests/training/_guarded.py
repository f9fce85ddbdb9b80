"""A small real training run with a divergence guard, shared by the guard tests: an MLP (or a
sparse embedding) on a synthetic regression task, a ResumableSampler, a Checkpointer saving every
few steps, and batches that can be poisoned (their targets scaled up: a loss spike) or made NaN."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import deltackpt
from deltackpt.training import Checkpointer, Guard, ResumableSampler, training_state
from deltackpt.training.policies import EveryN

N = 512


class SparseNet(torch.nn.Module):
    """An embedding table trained with SparseAdam (sparse gradients), read through a fixed projection."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(N, 8, sparse=True)
        self.register_buffer("proj", torch.linspace(-1, 1, 8))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return (self.emb(idx) * self.proj).sum(1, keepdim=True) + x[:, :1]


class Dense(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def data(seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True), torch.arange(N))


@dataclass
class Run:
    model: torch.nn.Module
    opt: Any
    sched: Any
    scaler: Any
    sampler: ResumableSampler
    loader: Any
    guard: Guard
    ckpt: Checkpointer
    step: int = 0
    losses: list = field(default_factory=list)
    seen: list = field(default_factory=list)      # (step, sample indices) of every batch trained on
    rollbacks: list = field(default_factory=list)
    info: Any = None             # what resume restored, for a resumed run

    def state(self, step: int) -> dict:
        return training_state(model=self.model, optimizer=self.opt, scheduler=self.sched, scaler=self.scaler,
                              sampler=self.sampler, step=step)


def make_run(repo: Any, *, opt: str = "adamw", every: int = 5, scaler: bool = False, seed: int = 0,
             guard: dict | None = None, ckpt: dict | None = None, resume: bool = False) -> Run:
    """A fresh run, or (``resume=True``) one resumed from the repository's latest version."""
    torch.manual_seed(seed)
    model: torch.nn.Module = SparseNet() if opt == "sparse" else Dense()
    if opt == "sparse":
        optimizer: Any = torch.optim.SparseAdam(list(model.parameters()), lr=1e-2)
    elif opt == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, 7, gamma=0.9)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3) if scaler else None
    sampler = ResumableSampler(N, seed=seed)
    loader = torch.utils.data.DataLoader(data(seed), batch_size=8, sampler=sampler, generator=torch.Generator())
    info = deltackpt.resume(repo, model=model, optimizer=optimizer, scheduler=sched, scaler=grad_scaler,
                            sampler=sampler) if resume else None
    start_step = info.step if info is not None else None
    g = Guard(model=model, optimizer=optimizer, scheduler=sched, scaler=grad_scaler, sampler=sampler,
              **(guard or {}))
    c = Checkpointer(repo, EveryN(every), guard=g, **{"blocking": True, "start_step": start_step, **(ckpt or {})})
    run = Run(model, optimizer, sched, grad_scaler, sampler, loader, g, c, step=start_step or 0, info=info)
    OPEN.append(run)
    return run


#: the runs made by the current test: tests/training/conftest.py closes them after it (their
#: Checkpointer's handle and the guard's holds), as a training script ends its Checkpointer
OPEN: list[Run] = []


def close_all() -> None:
    while OPEN:
        run = OPEN.pop()
        try:
            run.ckpt.close()
        except Exception:  # noqa: BLE001 - a test that expected the run to fail has asserted it
            run.guard.close()


def train(run: Run, until: int, poison: Callable[[int, torch.Tensor], float | None] = lambda s, i: None,
          stop: Callable[[Run], bool] = lambda r: False) -> Run:
    """Train to step ``until``; ``poison(step, indices)`` returns a factor for the batch's targets
    (nan makes the loss NaN) or None.  After a rollback the loop goes on from its step with a new
    data iterator, as the guard asks."""
    while run.step < until and not stop(run):
        for x, y, idx in run.loader:
            factor = poison(run.step + 1, idx)
            if factor is not None:
                y = y * factor
            pred = run.model(x, idx)
            loss = torch.nn.functional.mse_loss(pred, y)
            run.opt.zero_grad()
            if run.scaler is not None:
                run.scaler.scale(loss).backward()
                run.scaler.step(run.opt)
                run.scaler.update()
            else:
                loss.backward()
                run.opt.step()
            run.sched.step()
            run.step += 1
            run.seen.append((run.step, idx.tolist()))
            run.losses.append((run.step, loss.item()))
            step = run.step
            run.ckpt.step(lambda: run.state(step), step=step, metrics={"loss": loss.item()})
            if run.ckpt.rollback is not None:
                run.rollbacks.append(run.ckpt.rollback)
                run.step = run.ckpt.rollback.step
                break          # a new data iterator: the sampler was moved
            if run.step >= until or stop(run):
                break
    return run
