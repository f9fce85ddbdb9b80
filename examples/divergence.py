"""A training run that goes bad and recovers by itself: a divergence guard rolls it back.

The same CPU run (an MLP classifier, SGD with momentum, StepLR, a ResumableSampler) is trained
three times with the same seeds:

* clean: no poison;
* guarded: a window of 4 batches arrives corrupted (inputs scaled up 200x, labels scrambled, as a
  bad shard would be) and a ``Guard`` watches the loss: at the first bad batch it rolls model,
  optimizer, scheduler, sampler and RNG back to the last sound version, skips the data read since
  and 8 batches more (``skip_ahead``), and training goes on;
* unguarded: the same poison, no guard.

It prints the three final held-out losses and exits 0 when the guarded run ends within
``--tolerance`` (relative) of the clean one.

    PYTHONPATH=. python examples/divergence.py --repo /tmp/div-ckpt
    deltackpt log --repo /tmp/div-ckpt          # the rollback is in the log

Runs on CPU in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import torch

from deltackpt.training import Checkpointer, Guard, ResumableSampler, training_state
from deltackpt.training.policies import EveryN

N, DIM, CLASSES, BATCH = 4096, 32, 4, 32


def make_data(seed: int = 1234) -> tuple[torch.utils.data.TensorDataset, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(DIM, CLASSES, generator=g)
    x = torch.randn(N + 1024, DIM, generator=g)
    y = (x @ w + 0.5 * torch.randn(N + 1024, CLASSES, generator=g)).argmax(1)
    return torch.utils.data.TensorDataset(x[:N], y[:N], torch.arange(N)), (x[N:], y[N:])


def train(repo: str | None, steps: int, poison: range | None, every: int, seed: int = 0) -> dict:
    """One run; ``poison``: the sampler positions (of epoch 0, 1, ...: a shard of the stream) whose
    batches arrive corrupted."""
    torch.manual_seed(seed)
    data, (x_val, y_val) = make_data()
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 128), torch.nn.ReLU(), torch.nn.Linear(128, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 200, gamma=0.5)
    sampler = ResumableSampler(N, seed=seed)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
    ckpt = None
    if repo is not None:
        # the shard goes on past the batch that shows it: skip 8 batches more than what was read
        guard = Guard(model=model, optimizer=opt, scheduler=sched, sampler=sampler, watch="loss",
                      skip_ahead=8 * BATCH)
        ckpt = Checkpointer(repo, EveryN(every), guard=guard, blocking=True)
    step, rollbacks = 0, []
    while step < steps:
        for x, y, _ in loader:
            position = sampler.epoch * N + sampler.consumed - len(y)   # where in the stream this batch starts
            if poison is not None and position in poison:           # a bad shard: corrupted batches
                x, y = x * 200.0, y.flip(0)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if ckpt is not None:
                ckpt.step(lambda: training_state(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                                                 step=step), step=step, metrics={"loss": loss.item()})
                if ckpt.rollback is not None:     # rolled back in place: go on from its step, new iterator
                    rollbacks.append(ckpt.rollback)
                    step = ckpt.rollback.step
                    break
            if step >= steps:
                break
    if ckpt is not None:
        ckpt.close()
    with torch.no_grad():
        val = torch.nn.functional.cross_entropy(model(x_val), y_val).item()
    return {"val_loss": val, "rollbacks": [{"from_step": r.from_step, "to_step": r.step, "version": r.version.id,
                                            "rule": r.verdict.rule, "value": r.verdict.value,
                                            "bytes_read": r.bytes_read, "seconds": r.seconds,
                                            "skipped": r.skipped} for r in rollbacks]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", help="repository of the guarded run (default: a temporary folder, removed)")
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--every", type=int, default=25, help="save every N steps")
    ap.add_argument("--poison-at", type=int, default=340, help="the clean run's step that reads the first bad batch")
    ap.add_argument("--poison-len", type=int, default=4, help="bad batches in a row (a corrupted shard)")
    ap.add_argument("--tolerance", type=float, default=0.05, help="relative gap to the clean run that passes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    # the corrupted shard: the batches the clean run reads at steps poison_at .. poison_at + len - 1
    window = range((args.poison_at - 1) * BATCH, (args.poison_at - 1 + args.poison_len) * BATCH, BATCH)
    scratch = tempfile.mkdtemp(prefix="deltackpt-divergence-") if args.repo is None else None
    try:
        clean = train(None, args.steps, None, args.every)
        repo = args.repo or os.path.join(scratch, "repo")  # type: ignore[arg-type]
        guarded = train(repo, args.steps, window, args.every)
        unguarded = train(None, args.steps, window, args.every)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    gap = abs(guarded["val_loss"] - clean["val_loss"]) / clean["val_loss"]
    ok = gap <= args.tolerance and bool(guarded["rollbacks"])
    result = {"clean": clean["val_loss"], "guarded": guarded["val_loss"], "unguarded": unguarded["val_loss"],
              "gap": gap, "tolerance": args.tolerance, "ok": ok, "rollbacks": guarded["rollbacks"]}
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        for r in guarded["rollbacks"]:
            print(f"rollback: loss {r['value']:.4g} ({r['rule']}) at step {r['from_step']} -> version "
                  f"{r['version'][:10]} (step {r['to_step']}), {r['bytes_read']} bytes read in {r['seconds']:.3f} s, "
                  f"skipped sampler window {r['skipped']}")
        print(f"held-out loss: clean {clean['val_loss']:.4f}, guarded {guarded['val_loss']:.4f} "
              f"({100 * gap:.2f}% from clean, tolerance {100 * args.tolerance:g}%), "
              f"unguarded {unguarded['val_loss']:.4g}")
        print("recovered" if ok else "NOT recovered")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
