"""`make demo`: train a small real model on CPU, checkpoint it into a deltackpt repository every
25 steps, then show the repository with the CLI: log, du, a one-layer restore, gc and verify.

``python examples/demo.py [--dir DIR] [--steps N]`` (default: ./demo-repo and ./demo-out, 300 steps).
It imports only the core's dependencies (tests/test_core_only.py checks that)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import torch
from torch import nn

import deltackpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.join(ROOT, "demo-repo")
OUT = os.path.join(ROOT, "demo-out")
STEPS, EVERY = 300, 25


class TinyClassifier(nn.Module):
    """An embedding bag, an encoder of two MLP blocks and a head: three 'layers' to restore apart."""

    def __init__(self, vocab: int = 5000, dim: int = 128, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim)
        self.encoder = nn.Sequential(nn.Linear(dim, 256), nn.GELU(), nn.Linear(256, dim), nn.GELU())
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


def batch(gen: torch.Generator, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 4, (n,), generator=gen)
    # each class draws most of its tokens from its own quarter of the vocabulary: learnable, not trivial
    own = labels[:, None] * 1250 + torch.randint(0, 1250, (n, 16), generator=gen)
    noise = torch.randint(0, 5000, (n, 16), generator=gen)
    ids = torch.where(torch.rand(n, 16, generator=gen) < 0.3, own, noise)
    return ids, labels


def cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "deltackpt.cli.main", *args, "--repo", REPO]
    print(f"\n$ deltackpt {' '.join(args)} --repo demo-repo", flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    global REPO, OUT, STEPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where demo-repo and demo-out go (default: the project root)")
    ap.add_argument("--steps", type=int, default=STEPS, help="training steps (at least 4 versions: >= 100)")
    args = ap.parse_args()
    if args.dir:
        REPO, OUT = os.path.join(args.dir, "demo-repo"), os.path.join(args.dir, "demo-out")
    STEPS = max(4 * EVERY, args.steps)
    shutil.rmtree(REPO, ignore_errors=True)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    train_and_checkpoint()
    tour()


def train_and_checkpoint() -> None:
    """Train for STEPS steps, saving a version every EVERY steps (and a torch.save to compare)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TinyClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
    print(f"training {sum(p.numel() for p in model.parameters()):,} parameters for {STEPS} steps, "
          f"a version every {EVERY} steps into {REPO}")
    full_bytes = 0
    save_seconds = 0.0
    for step in range(1, STEPS + 1):
        if step == STEPS // 2 + 1:
            # fine-tuning often freezes most of a model: unchanged chunks are then never written again
            print("freezing the embedding for the second half: watch the written bytes drop")
            model.embed.weight.requires_grad_(False)
        ids, labels = batch(gen)
        loss = nn.functional.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % EVERY == 0:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                     "step": step, "rng": torch.get_rng_state()}
            t0 = time.perf_counter()
            v = deltackpt.save(state, REPO, step=step, metrics={"loss": loss.item()},
                               tag="first" if step == EVERY else None)
            save_seconds += time.perf_counter() - t0
            torch.save(state, os.path.join(OUT, "torch_save.pt"))
            full_bytes = os.path.getsize(os.path.join(OUT, "torch_save.pt"))
            print(f"step {step:4d}  loss {loss.item():.3f}  version {v.short_id}  wrote {v.written_bytes / 1e6:6.2f} MB "
                  f"(torch.save of the same state: {full_bytes / 1e6:.2f} MB)")
    print(f"\n{STEPS // EVERY} versions saved in {save_seconds:.2f} s in all")


def tour() -> None:
    """Show the repository with the CLI, restore one layer from Python, then gc and verify."""
    cli("log")
    cli("du")
    cli("show", "latest~2")
    cli("diff", "latest~1", "latest")
    cli("restore", "latest~3", "--layer", "encoder", "-o", os.path.join(OUT, "encoder.safetensors"))

    # the same layer restore from Python, straight into a fresh model's parameters
    fresh = TinyClassifier()
    deltackpt.restore(fresh, REPO, "latest~3", layers=["encoder"])
    old = deltackpt.load(REPO, "latest~3", layers=["encoder"])["model"]
    assert all(torch.equal(fresh.state_dict()[k], t) for k, t in old.items())
    print(f"restored {len(old)} encoder tensors of latest~3 into a fresh model, bit-identical")

    cli("gc", "--keep-last", "3", "--dry-run")
    cli("gc", "--keep-last", "3", "--grace", "0")
    cli("log")
    cli("verify")
    print("\ndemo done: the repository is in ./demo-repo")


if __name__ == "__main__":
    main()
