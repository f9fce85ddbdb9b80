"""A plain PyTorch training loop that checkpoints into a deltackpt repository and resumes exactly.

Kill it at any moment (even with SIGKILL) and run it again with the same arguments: it resumes
from the newest version that verifies, and its final weights are bit-identical to an
uninterrupted run (RNG states, LR scheduler, data order and position are all restored).

    python examples/plain_loop.py --repo /tmp/plain-ckpt --steps 300
    deltackpt log /tmp/plain-ckpt

Runs on CPU in a few seconds.
"""

from __future__ import annotations

import argparse
import random
import sys

import numpy as np
import torch

import deltackpt
from deltackpt.training.policies import EveryN, OnImprovement
from deltackpt.training import Checkpointer, ResumableSampler, resume, training_state


def make_data(n: int = 2048, dim: int = 32) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(n, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=20, help="save every N steps")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--final", help="also save the final weights to this repository")
    ap.add_argument("--blocking", action="store_true", help="save in the foreground")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    data = make_data()
    model = torch.nn.Sequential(torch.nn.Linear(32, args.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(args.hidden, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.7)
    sampler = ResumableSampler(len(data), seed=7)
    # the loader gets its own generator: by default each new iterator draws a seed from the global
    # torch RNG, so a resumed run (one extra iterator) would drift from an uninterrupted one
    loader = torch.utils.data.DataLoader(data, batch_size=32, sampler=sampler, generator=torch.Generator())

    info = resume(args.repo, model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    step = info.step if info else 0
    print(f"resumed at step {step}" if info else "fresh start", flush=True)

    ckpt = Checkpointer(args.repo, policy=[EveryN(args.every), OnImprovement("val_loss")],
                        retention=deltackpt.Retention(keep_last=3, keep_best=("val_loss", 1, "min")),
                        blocking=args.blocking, start_step=step)
    while step < args.steps:
        sampler.set_epoch(sampler.epoch)
        for x, y in loader:
            # noise from all three global generators, so an inexact RNG restore would show
            x = x + torch.from_numpy(np.random.normal(0, 0.01, x.shape).astype(np.float32))
            x = x * (1.0 + 0.01 * random.random())
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            metrics = {"loss": loss.item()}
            if step % args.every == 0:
                metrics["val_loss"] = round(loss.item(), 2)  # a stand-in for a validation pass
            ckpt.step(lambda: training_state(model=model, optimizer=opt, scheduler=sched, sampler=sampler, step=step),
                      step=step, metrics=metrics)
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step >= args.steps:
                break
    ckpt.close()
    if args.final:
        deltackpt.save(model, args.final, step=step)
    print(f"done at step {step}; {ckpt.saves} saves, {ckpt.stall_seconds:.3f} s blocked", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
