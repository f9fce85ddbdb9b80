"""`make demo`: train a small real model on CPU, checkpoint it into a deltackpt repository every
25 steps (and through torch.save, to compare), measure restores against torch.load, then show the
repository with the CLI: log, du, a one-layer restore, gc and verify.

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
TORCH_FILE = os.path.join(OUT, "torch_save.pt")
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
    global REPO, OUT, STEPS, TORCH_FILE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where demo-repo and demo-out go (default: the project root)")
    ap.add_argument("--steps", type=int, default=STEPS, help="training steps (at least 4 versions: >= 100)")
    args = ap.parse_args()
    if args.dir:
        REPO, OUT = os.path.join(args.dir, "demo-repo"), os.path.join(args.dir, "demo-out")
        TORCH_FILE = os.path.join(OUT, "torch_save.pt")
    STEPS = max(4 * EVERY, args.steps)
    shutil.rmtree(REPO, ignore_errors=True)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    train_and_checkpoint()
    restore_figures()
    tour()


def dir_bytes(path: str) -> int:
    """Bytes of every file under ``path``: what the repository takes on disk."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _dirs, files in os.walk(path) for f in files)


def train_and_checkpoint() -> None:
    """Train for STEPS steps, saving a version every EVERY steps; the same state also goes through
    torch.save, so the repository is measured against the files torch.save would have left."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TinyClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
    print(f"training {sum(p.numel() for p in model.parameters()):,} parameters for {STEPS} steps, "
          f"a version every {EVERY} steps into {REPO}\n")
    print(WRITES)
    files_bytes, save_seconds, growth = 0, 0.0, {"dense": [], "frozen": []}
    for step in range(1, STEPS + 1):
        if step == STEPS // 2 + 1:
            # fine-tuning often freezes most of a model: unchanged chunks are then never written again
            print("freezing the embedding for the second half: its chunks stop changing")
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
            before = dir_bytes(REPO) if os.path.exists(REPO) else 0
            t0 = time.perf_counter()
            v = deltackpt.save(state, REPO, step=step, metrics={"loss": loss.item()},
                               tag="first" if step == EVERY else None)
            save_seconds += time.perf_counter() - t0
            torch.save(state, TORCH_FILE)
            files_bytes += os.path.getsize(TORCH_FILE)
            size = dir_bytes(REPO)
            if step > EVERY:
                growth["frozen" if step > STEPS // 2 else "dense"].append(size - before)
            print(f"step {step:4d}  loss {loss.item():.3f}  version {v.short_id}  wrote {v.written_bytes / 1e6:5.2f} MB, "
                  f"repository {size / 1e6:5.1f} MB (+{(size - before) / 1e6:4.2f})  |  "
                  f"{step // EVERY:2d} torch.save files {files_bytes / 1e6:5.1f} MB")
    summary(files_bytes, save_seconds, growth)


WRITES = """\
What a save writes: the chunks that changed, compressed, each whole or as a small delta against
the previous version; chunks that did not change are not written again.  Older versions are
re-stored as deltas later only where that saves more bytes than it writes, so a save writes about
what the repository grows by.
"""


def summary(files_bytes: int, save_seconds: float, growth: dict[str, list[int]]) -> None:
    n, size = STEPS // EVERY, dir_bytes(REPO)
    mean = lambda xs: sum(xs) / len(xs) / 1e6 if xs else 0.0  # noqa: E731
    print(f"\n{n} versions saved in {save_seconds:.2f} s in all.  On disk: the repository {size / 1e6:.1f} MB, "
          f"{n} torch.save files {files_bytes / 1e6:.1f} MB ({size / files_bytes:.2f}x).")
    print(f"The repository grew by {mean(growth['dense']):.2f} MB a save while every weight trained, and by\n"
          f"{mean(growth['frozen']):.2f} MB once the embedding was frozen (a torch.save file: {files_bytes / n / 1e6:.2f} MB).")


def restore_figures() -> None:
    """What a restore reads and how long it takes, against torch.load of the same version's file.
    Each deltackpt read opens a fresh handle over a store that counts the bytes it returns."""
    from deltackpt.store import LocalStore
    from deltackpt.store.counting import CountingStore

    def counted(what: str, read) -> tuple[str, float, int]:
        store = CountingStore(LocalStore(REPO))
        repo = deltackpt.Repo(store)
        t0 = time.perf_counter()
        read(repo)
        return what, time.perf_counter() - t0, store.bytes_read_under("packs/")

    t0 = time.perf_counter()
    torch.load(TORCH_FILE, weights_only=True)
    rows = [("torch.load of the latest torch.save file", time.perf_counter() - t0, os.path.getsize(TORCH_FILE))]
    rows.append(counted("deltackpt.load of the latest version", lambda r: r.load("latest")))
    rows.append(counted("deltackpt.load of its encoder only", lambda r: r.load("latest", layers=["encoder"])))
    model = TinyClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    deltackpt.restore(model, REPO, "latest", optimizer=opt)   # the live run holds the latest version
    rows.append(counted("roll the live model + optimizer back one version",
                        lambda r: r.restore(model, "latest~1", optimizer=opt)))
    print("\nRestores (warm page cache; bytes are what each read fetched from the files):")
    for what, seconds, nbytes in rows:
        print(f"  {what:<50} {nbytes / 1e6:6.2f} MB  {seconds * 1e3:6.1f} ms")
    print("deltackpt decodes what it reads, so a full load takes longer than torch.load; a layer, or a\n"
          "rollback of a live model (it reads only the chunks that differ), reads a fraction of the file.")


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
    print("\n(--grace 0: gc normally spares for 10 minutes pack files no index names yet, as they may be a\n"
          " save still running in another process; nothing else writes to this repository)")
    cli("gc", "--keep-last", "3", "--grace", "0")
    cli("log")
    cli("verify")
    print("\ndemo done: the repository is in ./demo-repo")


if __name__ == "__main__":
    main()
