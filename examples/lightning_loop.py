"""PyTorch Lightning with every checkpoint stored in a deltackpt repository.

``DeltackptIO`` turns each ModelCheckpoint save into a repository version (deltas against the
previous one) and leaves a small pointer file where Lightning expects the .ckpt, so
``ckpt_path=".../last.ckpt"`` resumes from the repository.

    python examples/lightning_loop.py --repo /tmp/pl-ckpt --steps 60          # trains, saves every 20 steps
    python examples/lightning_loop.py --repo /tmp/pl-ckpt --steps 100 --resume  # continues from last.ckpt
    deltackpt log --repo /tmp/pl-ckpt

Runs on CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import os
import sys

import pytorch_lightning as pl
import torch

import deltackpt
from deltackpt.integrations.lightning import DeltackptIO


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 128, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()   # plain values: stored in the version as they are
        self.net = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.5)}


def loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 32, generator=g)
    y = x @ torch.randn(32, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                       generator=g)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args = ap.parse_args(argv)

    ckpt_dir = os.path.join(args.repo + "-pointers")
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.every, save_top_k=-1,
                                              save_last=True)
    trainer = pl.Trainer(max_steps=args.steps, plugins=[DeltackptIO(args.repo)], callbacks=[checkpoint],
                         accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=os.path.dirname(os.path.abspath(args.repo)))
    torch.manual_seed(0)
    last = os.path.join(ckpt_dir, "last.ckpt")
    trainer.fit(Regressor(), loader(), ckpt_path=last if args.resume and os.path.exists(last) else None)
    for v in deltackpt.Repo(args.repo).log()[:5]:
        print(f"{v.short_id}  step {v.step}  written {v.written_bytes} B of {v.logical_bytes} B  tags {list(v.tags)}")
    print(f"done at step {trainer.global_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
