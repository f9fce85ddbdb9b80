"""PyTorch Lightning: DeltackptIO stores ModelCheckpoint saves in a repository and resumes from them."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

import deltackpt  # noqa: E402
from deltackpt.errors import UnknownVersionError, UnsupportedLeafError  # noqa: E402
from deltackpt.integrations.lightning import DeltackptIO, to_plain  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, width: int = 16, where: str = "x") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
        self.start_weights = None

    def on_train_start(self):
        self.start_weights = {k: v.clone() for k, v in self.state_dict().items()}

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 3)}


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _trainer(tmp_path, repo, max_steps):
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=5, save_top_k=-1,
                                        save_last=True)
    return pl.Trainer(max_steps=max_steps, plugins=[DeltackptIO(repo)], callbacks=[ckpt], accelerator="cpu",
                      logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=str(tmp_path)), ckpt


def test_model_checkpoint_saves_go_to_the_repository_and_resume(tmp_path, repo_path):
    """Every ModelCheckpoint save becomes a version (pointer files at Lightning's paths), and
    ckpt_path= resumes weights, optimizer and loop position from the repository."""
    torch.manual_seed(0)
    model = Tiny()
    trainer, ckpt = _trainer(tmp_path, repo_path, 10)
    trainer.fit(model, _loader())
    versions = deltackpt.Repo(repo_path).log()
    assert sorted({v.step for v in versions}) == [5, 10]
    files = sorted(os.listdir(tmp_path / "ckpts"))
    assert "last.ckpt" in files and len(files) == 3
    assert open(tmp_path / "ckpts" / "last.ckpt").read().startswith("deltackpt ")
    saved = deltackpt.load(repo_path, "latest")
    assert saved["global_step"] == 10 and saved["hyper_parameters"] == {"width": 16, "where": "x"}
    assert saved["optimizer_states"][0]["state"] and saved["lr_schedulers"][0]["last_epoch"] >= 1

    torch.manual_seed(1)
    model2 = Tiny()
    trainer2, _ = _trainer(tmp_path, repo_path, 15)
    trainer2.fit(model2, _loader(), ckpt_path=str(tmp_path / "ckpts" / "last.ckpt"))
    assert trainer2.global_step == 15
    for k, v in saved["state_dict"].items():
        assert torch.equal(model2.start_weights[k], v), k
    assert deltackpt.Repo(repo_path).verify().ok


def test_removed_checkpoints_and_revisions(tmp_path, repo_path):
    """remove_checkpoint drops the pointer and its tag; a repository revision works as ckpt_path."""
    io = DeltackptIO(repo_path)
    path = str(tmp_path / "a" / "epoch=0-step=3.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "global_step": 3, "epoch": 0}, path)
    assert io.load_checkpoint(path)["global_step"] == 3
    assert io.load_checkpoint("latest")["global_step"] == 3
    io.remove_checkpoint(path)
    assert not os.path.exists(path) and not deltackpt.Repo(repo_path).tags()
    with pytest.raises(UnknownVersionError):
        io.load_checkpoint(str(tmp_path / "missing.ckpt"))


def test_non_plain_entries_are_converted_or_refused():
    """Paths, numpy values and dtypes are converted and listed; an arbitrary object is refused by name."""
    import numpy as np
    converted = {}
    out = to_plain({"hp": {"root": pathlib.Path("/data"), "n": np.int64(3), "dt": torch.float16,
                           "arr": np.arange(3)}}, "", converted)
    assert out["hp"]["root"] == "/data" and out["hp"]["n"] == 3 and out["hp"]["dt"] == "torch.float16"
    assert torch.equal(out["hp"]["arr"], torch.arange(3))
    assert set(converted) == {"hp.root", "hp.n", "hp.dt", "hp.arr"}
    with pytest.raises(UnsupportedLeafError, match="hyper_parameters.fn"):
        to_plain({"hyper_parameters": {"fn": object()}})
