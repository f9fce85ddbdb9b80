"""Lightning runs and deltackpt's retention know of each other: versions record the metrics
(``best:`` and ``keep_best`` work with ``ModelCheckpoint(monitor=...)``), ModelCheckpoint's files
map onto tags (top-k removal and ``last.ckpt`` overwrites untag; two folders never share a tag),
and a run resumes from a ``.ckpt`` torch.save wrote before the switch.  Real Trainers on CPU."""

from __future__ import annotations

import json
import os

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

import deltackpt  # noqa: E402
from deltackpt.errors import CheckpointNotFoundError, ForeignFileError  # noqa: E402
from deltackpt.integrations.lightning import METRICS_KEY, DeltackptIO, DeltackptMetrics  # noqa: E402
from tests.conftest import run_cli  # noqa: E402


class Logged(pl.LightningModule):
    """Logs train_loss (and a constant 'lr') every step, val_loss when validated; remembers the
    train_loss logged for each global step (the step a checkpoint saved after it carries)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.train_loss: dict[int, float] = {}
        self.val_loss: dict[int, float] = {}
        self.start_weights = None

    def on_train_start(self):
        self.start_weights = {k: v.clone() for k, v in self.state_dict().items()}

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        self.log("lr", 0.05)
        self.train_loss[self.global_step + 1] = loss.item()   # the step counter after this batch's optimizer step
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("val_loss", loss)
        self.val_loss[self.global_step] = loss.item()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _trainer(root, plugins, callbacks, steps, **kw):
    return pl.Trainer(max_steps=steps, plugins=plugins, callbacks=callbacks, accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root), **kw)


def _pointer_id(path) -> str:
    return open(path).read().split()[-1]


def _top_k(tmp_path, repo_path, *, metrics_callback: bool, steps: int = 6, k: int = 2, save_last: bool = True):
    torch.manual_seed(0)
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), monitor="train_loss", save_top_k=k,
                                        every_n_train_steps=1, save_last=save_last)
    callbacks = [ckpt, DeltackptMetrics()] if metrics_callback else [ckpt]
    model = Logged()
    _trainer(tmp_path, [DeltackptIO(repo_path)], callbacks, steps, limit_val_batches=0).fit(model, _loader())
    return ckpt, model


def test_top_k_saves_record_the_monitored_score_and_best_resolves_to_the_best_file(tmp_path, repo_path):
    """With ModelCheckpoint(monitor="train_loss") and DeltackptIO alone, each top-k file's version
    records the score ModelCheckpoint ranked it by; best:train_loss (the API and the real CLI in a
    subprocess) is the version of ModelCheckpoint's best_model_path."""
    ckpt, _ = _top_k(tmp_path, repo_path, metrics_callback=False)
    repo = deltackpt.Repo(repo_path)
    assert len(ckpt.best_k_models) == 2
    for path, score in ckpt.best_k_models.items():
        version = repo.resolve(_pointer_id(path))
        assert version.metrics == {"train_loss": score.item()}, (path, version.metrics)
    best = _pointer_id(ckpt.best_model_path)
    assert repo.resolve("best:train_loss").id == best
    shown = json.loads(run_cli("show", "best:train_loss", "--repo", repo_path, "--json").stdout)
    assert shown["version"]["id"] == best
    assert shown["version"]["metrics"]["train_loss"] == pytest.approx(ckpt.best_model_score.item(), rel=0, abs=0)


def test_the_metrics_callback_records_every_logged_metric_at_each_save(tmp_path, repo_path):
    """With DeltackptMetrics, every version (top-k files, last.ckpt, a second every-2-steps
    ModelCheckpoint, a validation-time save) records trainer.callback_metrics at its step: the
    train_loss logged for that step, lr, and val_loss once validation ran; the key is not in the
    stored state, so the checkpoint loads back as Lightning made it."""
    torch.manual_seed(0)
    by_val = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "val"), monitor="val_loss", save_top_k=-1,
                                          save_last=True)
    every2 = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "every2"), every_n_train_steps=2, save_top_k=-1)
    model = Logged()
    _trainer(tmp_path, [DeltackptIO(repo_path)], [by_val, every2, DeltackptMetrics()], 8, val_check_interval=4,
             limit_val_batches=1).fit(model, _loader(), _loader())
    versions = deltackpt.Repo(repo_path).log()
    assert len(versions) >= 7   # every2: 2, 4, 6, 8; val: 4, 8; last: 4, 8
    for v in versions:
        assert v.metrics["train_loss"] == model.train_loss[v.step], (v.step, v.metrics)
        assert v.metrics["lr"] == pytest.approx(0.05)
    by_val_saves = [v for v in versions if os.sep + "val" + os.sep in v.meta["lightning_path"]]
    assert sorted(v.step for v in by_val_saves) == [4, 4, 8, 8]   # a top-k file and last.ckpt after each validation
    for v in by_val_saves:
        assert v.metrics["val_loss"] == model.val_loss[v.step]
    # every2 saves before validation at step 8: it records the val_loss of step 4, the one logged then
    assert deltackpt.Repo(repo_path).resolve("ckpt-epoch_0-step_6").metrics["val_loss"] == model.val_loss[4]
    # the best val_loss is held by the top-k file and by last.ckpt saved at the same step: best: takes the newer
    best = deltackpt.Repo(repo_path).resolve("best:val_loss")
    assert best.metrics["val_loss"] == by_val.best_model_score.item() and best.id == _pointer_id(by_val.last_model_path)
    back = DeltackptIO(repo_path).load_checkpoint(by_val.last_model_path)
    assert METRICS_KEY not in back and METRICS_KEY not in deltackpt.load(repo_path, "latest")


def test_keep_best_keeps_the_best_versions_by_a_monitored_metric(tmp_path, repo_path):
    """gc(keep_best=("train_loss", 2, "min")) on a Lightning run keeps the two versions with the lowest
    train_loss (and latest), removes the rest, and what it keeps still loads."""
    _top_k(tmp_path, repo_path, metrics_callback=True, k=-1)
    repo = deltackpt.Repo(repo_path)
    before = repo.log()
    lowest = sorted(before, key=lambda v: (v.metrics["train_loss"], -v.time))[:2]
    report = deltackpt.gc(repo_path, keep_best=("train_loss", 2, "min"), keep_tags=False)
    kept = {v.id for v in deltackpt.Repo(repo_path).log()}
    assert kept == {v.id for v in lowest} | {before[0].id}
    assert len(report.removed) == len(before) - len(kept)
    for vid in kept:
        assert deltackpt.load(repo_path, vid)["global_step"] > 0
    assert deltackpt.Repo(repo_path).verify().ok


def test_top_k_rotation_and_last_map_onto_tags_and_gc(tmp_path, repo_path):
    """Every file ModelCheckpoint keeps is a tag on its version (last.ckpt is ckpt-last); a file it
    removed or overwrote left its version untagged.  gc(keep_last=0) then removes exactly those:
    what remains is the tagged versions and latest, and every file still loads."""
    ckpt, _ = _top_k(tmp_path, repo_path, metrics_callback=True, steps=8, k=2)
    repo = deltackpt.Repo(repo_path)
    files = sorted(os.listdir(tmp_path / "ckpts"))
    assert len(files) == 3 and "last.ckpt" in files
    tags = repo.tags()
    assert set(tags) == {"ckpt-" + f.removesuffix(".ckpt").replace("=", "_") for f in files}
    for f in files:
        assert tags["ckpt-" + f.removesuffix(".ckpt").replace("=", "_")] == _pointer_id(tmp_path / "ckpts" / f)
    assert len(repo.log()) > len(tags) + 4   # last.ckpt at each of 8 steps, a top-k file when in the best 2
    deltackpt.gc(repo_path, keep_last=0)
    left = {v.id for v in deltackpt.Repo(repo_path).log()}
    assert left == set(tags.values()) | {repo.resolve("latest").id}
    io = DeltackptIO(repo_path)
    for f in files:
        assert io.load_checkpoint(str(tmp_path / "ckpts" / f))["global_step"] > 0


def test_two_folders_writing_last_ckpt_keep_their_own_tags(tmp_path, repo_path):
    """Two ModelCheckpoints in one Trainer, each with save_last into its own folder: each last.ckpt
    keeps a tag on its own version, so gc(keep_last=0) removes neither and both files load (one
    shared tag used to move between them, leaving one file naming a version gc removed)."""
    torch.manual_seed(0)
    a = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "a"), every_n_train_steps=2, save_top_k=-1,
                                     save_last=True)
    b = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "b"), every_n_train_steps=3, save_top_k=1,
                                     monitor="train_loss", save_last=True)
    _trainer(tmp_path, [DeltackptIO(repo_path)], [a, b], 7, limit_val_batches=0).fit(Logged(), _loader())
    repo = deltackpt.Repo(repo_path)
    ids = {name: _pointer_id(tmp_path / name / "last.ckpt") for name in ("a", "b")}
    assert ids["a"] != ids["b"]
    assert set(ids.values()) <= set(repo.tags().values())
    deltackpt.gc(repo_path, keep_last=0)
    io = DeltackptIO(repo_path)
    for name in ("a", "b"):
        assert io.load_checkpoint(str(tmp_path / name / "last.ckpt"))["global_step"] >= 6
    # removing one folder's file leaves the other's tag alone
    io.remove_checkpoint(str(tmp_path / "a" / "last.ckpt"))
    assert ids["b"] in deltackpt.Repo(repo_path).tags().values()
    assert ids["a"] not in deltackpt.Repo(repo_path).tags().values()


def test_a_run_resumes_from_a_ckpt_file_torch_save_wrote(tmp_path, repo_path):
    """A run checkpointed by Lightning's default TorchCheckpointIO resumes under DeltackptIO from
    its old last.ckpt (read with the weights-only loader); its next saves go to the repository."""
    torch.manual_seed(0)
    old = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "old"), every_n_train_steps=2, save_last=True)
    first = Logged()
    _trainer(tmp_path, None, [old], 4, limit_val_batches=0).fit(first, _loader())
    saved = torch.load(old.last_model_path, weights_only=True)
    new = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "new"), every_n_train_steps=2, save_last=True)
    second = Logged()
    trainer = _trainer(tmp_path, [DeltackptIO(repo_path)], [new, DeltackptMetrics()], 6, limit_val_batches=0)
    trainer.fit(second, _loader(), ckpt_path=old.last_model_path)
    assert trainer.global_step == 6
    for k, v in saved["state_dict"].items():
        assert torch.equal(second.start_weights[k], v), k
    assert sorted({v.step for v in deltackpt.Repo(repo_path).log()}) == [6]


def test_a_ckpt_file_that_needs_pickle_is_refused_without_running_it(tmp_path, repo_path):
    """A non-pointer file the weights-only loader refuses is one ForeignFileError naming the file."""
    path = str(tmp_path / "evil.ckpt")
    torch.save({"state_dict": {}, "obj": _Unpicklable()}, path)
    _Unpicklable.loaded = False
    with pytest.raises(ForeignFileError, match="evil.ckpt"):
        DeltackptIO(repo_path).load_checkpoint(path)
    assert not _Unpicklable.loaded


class _Unpicklable:
    loaded = False

    def __setstate__(self, state):
        type(self).loaded = True


def test_a_file_naming_a_version_gc_removed_says_so(tmp_path, repo_path):
    """Loading a pointer file whose version gc removed (keep_tags=False) is FileNotFoundError naming
    the file and the version, not a bare unknown-id error."""
    io = DeltackptIO(repo_path)
    a, b = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "global_step": 1}, a)
    io.save_checkpoint({"state_dict": {"w": torch.zeros(2)}, "global_step": 2}, b)
    gone = _pointer_id(a)
    deltackpt.gc(repo_path, keep_last=0, keep_tags=False)
    with pytest.raises(FileNotFoundError) as info:
        io.load_checkpoint(a)
    assert isinstance(info.value, CheckpointNotFoundError)
    assert "a.ckpt" in str(info.value) and gone[:10] in str(info.value)
    assert io.load_checkpoint(b)["global_step"] == 2


def test_a_repository_path_with_spaces(tmp_path):
    """Pointer files name the repository by its path; a path with spaces still resumes."""
    repo = str(tmp_path / "my runs" / "ckpt store")
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), every_n_train_steps=2, save_last=True)
    torch.manual_seed(0)
    _trainer(tmp_path, [DeltackptIO(repo)], [ckpt], 2, limit_val_batches=0).fit(Logged(), _loader())
    trainer = _trainer(tmp_path, [DeltackptIO(repo)], [ckpt], 4, limit_val_batches=0)
    trainer.fit(Logged(), _loader(), ckpt_path=ckpt.last_model_path)
    assert trainer.global_step == 4 and deltackpt.Repo(repo).resolve("ckpt-last").step == 4
