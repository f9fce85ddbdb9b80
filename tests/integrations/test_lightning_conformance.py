"""DeltackptIO where Lightning's own checkpoint tests found it wanting: remote dirpaths, pickling
(ddp_spawn, torch.save(trainer), deepcopy), a missing ckpt_path, config objects in hparams, and
threads left behind.  Real Trainers on CPU throughout."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import os
import pickle
import secrets
import tempfile
import threading

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")
fsspec = pytest.importorskip("fsspec")

import deltackpt  # noqa: E402
from deltackpt.errors import CheckpointNotFoundError, UnknownVersionError  # noqa: E402
from deltackpt.integrations.lightning import DeltackptIO  # noqa: E402
from deltackpt.integrations.plain import TYPE_KEY, from_plain, to_plain  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, width: int = 8, cfg=None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(4, width)
        self.out = torch.nn.Linear(width, 1)
        self.start_weights = None

    def on_train_start(self):
        self.start_weights = {k: v.clone() for k, v in self.state_dict().items()}

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.out(self.net(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _trainer(root, io, steps, dirpath, **kw):
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=-1, save_last=True)
    return pl.Trainer(max_steps=steps, plugins=[io], callbacks=[ckpt], accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root), **kw), ckpt


def _fit_and_resume(tmp_path, repo, dirpath):
    """Train 4 steps into ``dirpath``, resume to 6 from its last.ckpt; return the first run's last state."""
    torch.manual_seed(0)
    trainer, ckpt = _trainer(tmp_path, DeltackptIO(repo), 4, dirpath)
    trainer.fit(Tiny(), _loader())
    saved = deltackpt.load(repo, "latest")
    model = Tiny()
    trainer2, _ = _trainer(tmp_path, DeltackptIO(repo), 6, dirpath)
    trainer2.fit(model, _loader(), ckpt_path=ckpt.last_model_path)
    assert trainer2.global_step == 6
    for k, v in saved["state_dict"].items():
        assert torch.equal(model.start_weights[k], v), k
    return ckpt


# 1. remote dirpath ---------------------------------------------------------------------------------

def test_memory_dirpath_pointers_go_through_fsspec(tmp_path, repo_path, monkeypatch):
    """ModelCheckpoint(dirpath="memory://...") gets its pointer files in fsspec's memory filesystem
    (no local folder named 'memory:'), and ckpt_path= resumes from them."""
    monkeypatch.chdir(tmp_path)
    dirpath = f"memory://dk-{secrets.token_hex(4)}/ckpts"
    ckpt = _fit_and_resume(tmp_path, repo_path, dirpath)
    assert not os.path.exists(tmp_path / "memory:")
    fs = fsspec.filesystem("memory")
    names = sorted(os.path.basename(p) for p in fs.ls(dirpath, detail=False))
    assert "last.ckpt" in names and len(names) >= 3, names
    assert ckpt.last_model_path.startswith("memory://")
    assert fs.cat_file(ckpt.last_model_path).startswith(b"deltackpt ")


@pytest.fixture(scope="module")
def s3_server():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.store.s3server import S3Server
    server = S3Server()
    yield server
    server.stop()


def test_s3_dirpath_and_s3_repository(tmp_path, s3_server, monkeypatch):
    """With the repository and ModelCheckpoint's dirpath both on S3 (a real server on loopback), pointer
    files are S3 objects, nothing is written locally under the s3: name, and ckpt_path= resumes."""
    monkeypatch.chdir(tmp_path)
    s3_server.clear_fs_cache()
    bucket = s3_server.bucket()
    _fit_and_resume(tmp_path, f"s3://{bucket}/repo", f"s3://{bucket}/ckpts")
    assert not os.path.exists(tmp_path / "s3:")
    import s3fs
    names = [os.path.basename(p) for p in s3fs.S3FileSystem().ls(f"{bucket}/ckpts", detail=False)]
    assert "last.ckpt" in names, names


def test_removing_a_remote_checkpoint_removes_its_pointer(repo_path):
    """remove_checkpoint on a memory:// path deletes the pointer object and the version's tag."""
    io = DeltackptIO(repo_path)
    path = f"memory://dk-{secrets.token_hex(4)}/epoch=0-step=2.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 2}, path)
    fs = fsspec.filesystem("memory")
    assert fs.isfile(path) and deltackpt.Repo(repo_path).tags()
    assert torch.equal(io.load_checkpoint(path)["state_dict"]["w"], torch.ones(3))
    io.remove_checkpoint(path)
    assert not fs.exists(path) and not deltackpt.Repo(repo_path).tags()


# 2. pickling -----------------------------------------------------------------------------------------

def test_plugin_pickles_as_location_and_options_after_use(tmp_path, repo_path):
    """After a save and a load (an open repository, a delta cache) the plugin pickles; the copy reopens
    the repository at first use and saves on top of the same history."""
    io = DeltackptIO(repo_path, blocking=False)
    io.save_checkpoint({"state_dict": {"w": torch.randn(64, 64)}, "global_step": 1}, str(tmp_path / "a.ckpt"))
    io.load_checkpoint(str(tmp_path / "a.ckpt"))
    clone = pickle.loads(pickle.dumps(io))
    assert clone._repo is None and clone.blocking is False
    clone.save_checkpoint({"state_dict": {"w": torch.randn(64, 64)}, "global_step": 2}, str(tmp_path / "b.ckpt"))
    clone.teardown()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [2, 1]
    assert copy.deepcopy(io)._repo is None


def test_torch_save_of_a_trainer_and_deepcopy_of_callbacks(tmp_path, repo_path):
    """torch.save(trainer) works with the plugin in it after a fit, and so does deepcopy of the HF callback."""
    trainer, _ = _trainer(tmp_path, DeltackptIO(repo_path), 2, str(tmp_path / "ckpts"))
    trainer.fit(Tiny(), _loader())
    torch.save(trainer.strategy.checkpoint_io, str(tmp_path / "io.pt"))
    torch.save(trainer, str(tmp_path / "trainer.pt"))
    pytest.importorskip("transformers")
    from deltackpt.integrations.hf import DeltackptCallback
    cb = DeltackptCallback(repo_path, remove_hf_checkpoints=True)
    cb.repo.log()
    twin = copy.deepcopy([cb])[0]
    assert twin.remove_hf_checkpoints and twin.repo.location == cb.repo.location
    assert pickle.loads(pickle.dumps(cb)).repo.resolve().step == 2


def test_dcp_writer_and_reader_pickle_after_use(repo_path):
    """deltackpt.dcp Writer/Reader built on an open Repo pickle (DCP sends them to spawned ranks) and work after."""
    import torch.distributed.checkpoint as dcp
    import warnings

    import deltackpt.dcp
    state = {"w": torch.randn(16, 16)}
    writer = deltackpt.dcp.Writer(deltackpt.Repo(repo_path, create=True), step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=writer)
        writer2 = pickle.loads(pickle.dumps(writer))
        writer2.step = 2
        dcp.save({"w": state["w"] + 1}, storage_writer=writer2)
        reader = deltackpt.dcp.Reader(deltackpt.Repo(repo_path), version="latest")
        out = {"w": torch.zeros(16, 16)}
        dcp.load(out, storage_reader=reader)
        out2 = {"w": torch.zeros(16, 16)}
        dcp.load(out2, storage_reader=pickle.loads(pickle.dumps(reader)))
    assert torch.equal(out["w"], state["w"] + 1) and torch.equal(out2["w"], out["w"])


def test_ddp_spawn_with_two_processes(tmp_path, repo_path):
    """Trainer(strategy="ddp_spawn", devices=2) with the plugin trains, saves into the repository from
    rank 0, and a second ddp_spawn run resumes from last.ckpt."""
    ckpts = str(tmp_path / "ckpts")
    kw = {"strategy": "ddp_spawn", "devices": 2}
    trainer, _ = _trainer(tmp_path, DeltackptIO(repo_path), 4, ckpts, **kw)
    model = Tiny()
    trainer.fit(model, _loader())
    # the spawn launcher also hands rank 0's final weights back through the plugin: a transfer
    # written as a plain file, read by the main process and removed, never a (step-less) version
    repo = deltackpt.Repo(repo_path)
    assert sorted({v.step for v in repo.log()}) == [2, 4] and not any(".temp" in t for t in repo.tags())
    assert all(v.step is not None and "lightning_path" in v.meta for v in repo.log())
    saved = deltackpt.load(repo_path, "ckpt-last")["state_dict"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())   # the hand-back arrived
    trainer2, _ = _trainer(tmp_path, DeltackptIO(repo_path), 6, ckpts, **kw)
    trainer2.fit(Tiny(), _loader(), ckpt_path=os.path.join(ckpts, "last.ckpt"))
    assert deltackpt.Repo(repo_path).resolve("ckpt-last").step == 6
    assert deltackpt.Repo(repo_path).verify().ok


def test_the_spawn_hand_back_is_a_plain_file_not_a_version(repo_path):
    """What the spawn launchers do with rank 0's weights: save to <mkdtemp>/.temp.ckpt, load, remove.
    No version, no tag; the weights come back bit for bit; the file and its temp folder are gone."""
    io = DeltackptIO(repo_path)
    weights = {"net.weight": torch.randn(8, 4), "net.bias": torch.randn(8)}
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, ".temp.ckpt")
    io.save_checkpoint(weights, path)
    assert deltackpt.Repo(repo_path).log() == [] and not deltackpt.Repo(repo_path).tags()
    back = io.load_checkpoint(path)
    assert all(torch.equal(back[k], v) for k, v in weights.items())
    io.remove_checkpoint(path)
    assert not os.path.exists(folder)


# 3. a missing ckpt_path ----------------------------------------------------------------------------

def test_missing_ckpt_path_is_file_not_found(tmp_path, repo_path):
    """trainer.fit(ckpt_path=<missing file>) raises FileNotFoundError (Lightning's contract), still a KeyError."""
    trainer, _ = _trainer(tmp_path, DeltackptIO(repo_path), 2, str(tmp_path / "ckpts"))
    with pytest.raises(FileNotFoundError) as info:
        trainer.fit(Tiny(), _loader(), ckpt_path=str(tmp_path / "nope.ckpt"))
    assert isinstance(info.value, CheckpointNotFoundError) and isinstance(info.value, UnknownVersionError)
    assert isinstance(info.value, KeyError) and "nope.ckpt" in str(info.value)
    # Lightning's own message first (its tests match on it), ours after it
    missing = str(tmp_path / "nope.ckpt")
    assert str(info.value).startswith(f"Checkpoint file not found: {missing} (no deltackpt pointer file there, "
                                      "and not a revision of "), str(info.value)


# 4. config objects -----------------------------------------------------------------------------------

class Act(enum.Enum):
    RELU = "relu"
    GELU = "gelu"


@dataclasses.dataclass
class Optim:
    lr: float = 0.1
    betas: tuple = (0.9, 0.99)
    act: Act = Act.GELU


def test_config_objects_in_hparams_are_stored_and_resumed(tmp_path, repo_path):
    """save_hyperparameters() with a Namespace holding a dataclass, an enum and an AttributeDict saves
    (no pickle), resumes, and the plugin hands back the Namespace and AttributeDict rebuilt."""
    from pytorch_lightning.utilities.parsing import AttributeDict
    cfg = argparse.Namespace(name="run", optim=Optim(), act=Act.RELU, extra=AttributeDict(depth=2), kind=Optim)
    trainer, ckpt = _trainer(tmp_path, DeltackptIO(repo_path), 2, str(tmp_path / "ckpts"))
    trainer.fit(Tiny(cfg=cfg), _loader())
    raw = deltackpt.load(repo_path, "latest")["hyper_parameters"]["cfg"]
    assert raw[TYPE_KEY] == "argparse.Namespace" and raw["value"]["optim"]["class"].endswith("Optim")
    back = DeltackptIO(repo_path).load_checkpoint(ckpt.last_model_path)["hyper_parameters"]["cfg"]
    assert isinstance(back, argparse.Namespace) and back.name == "run"
    assert back.optim == {"lr": 0.1, "betas": (0.9, 0.99), "act": "gelu"} and back.act == "relu"
    assert isinstance(back.extra, AttributeDict) and back.extra.depth == 2
    assert back.kind == f"{__name__}.Optim"  # a user class comes back as its name, never imported
    trainer2, _ = _trainer(tmp_path, DeltackptIO(repo_path), 4, str(tmp_path / "ckpts"))
    trainer2.fit(Tiny(cfg=cfg), _loader(), ckpt_path=ckpt.last_model_path)
    assert deltackpt.Repo(repo_path).resolve().step == 4


def test_hparams_type_class_is_stored_by_name_and_only_allow_listed_classes_come_back():
    """A class in the checkpoint (Lightning's hparams_type) is stored as its qualified name; at load
    only allow-listed classes are rebuilt, any other name (even an importable one) stays a string."""
    from pytorch_lightning.utilities.parsing import AttributeDict
    state = to_plain({"hparams_type": argparse.Namespace, "other": AttributeDict, "mine": Optim})
    assert state["hparams_type"] == {TYPE_KEY: "class", "value": "argparse.Namespace"}
    back = from_plain(state)
    assert back["hparams_type"] is argparse.Namespace and back["other"] is AttributeDict
    assert back["mine"] == f"{__name__}.Optim"
    assert from_plain({TYPE_KEY: "class", "value": "os.system"}) == "os.system"
    assert from_plain({TYPE_KEY: "no-such-tag", "value": [1, 2]}) == [1, 2]


def test_omegaconf_config_in_hparams(tmp_path, repo_path):
    """A Hydra/OmegaConf DictConfig given to save_hyperparameters saves, resumes and comes back as a
    DictConfig with its interpolations unresolved."""
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"model": {"width": 8}, "lr": 0.1, "lr2": "${lr}", "layers": [1, 2]})

    class Hydra(Tiny):
        def __init__(self, cfg):
            super().__init__(width=cfg.model.width)
            self.save_hyperparameters(cfg)

    trainer, ckpt = _trainer(tmp_path, DeltackptIO(repo_path), 2, str(tmp_path / "ckpts"))
    trainer.fit(Hydra(cfg), _loader())
    back = DeltackptIO(repo_path).load_checkpoint(ckpt.last_model_path)
    assert isinstance(back["hyper_parameters"], omegaconf.DictConfig)
    assert omegaconf.OmegaConf.to_container(back["hyper_parameters"]) == omegaconf.OmegaConf.to_container(cfg)
    trainer2, _ = _trainer(tmp_path, DeltackptIO(repo_path), 4, str(tmp_path / "ckpts"))
    trainer2.fit(Hydra(cfg), _loader(), ckpt_path=ckpt.last_model_path)


# 5. threads --------------------------------------------------------------------------------------------

def test_no_read_thread_outlives_a_resume(tmp_path, repo_path):
    """After fit(ckpt_path=...) returns, no deltackpt-read thread is left running (Lightning's teardown check)."""
    _fit_and_resume(tmp_path, repo_path, str(tmp_path / "ckpts"))
    left = [t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith("deltackpt-read")]
    assert not left, left


def test_no_save_thread_outlives_a_background_saving_run(tmp_path, repo_path):
    """With blocking=False, once fit returns (the plugin's teardown ran) no deltackpt-save thread is
    left, every save committed, and a later background save starts a new thread."""
    trainer, _ = _trainer(tmp_path, DeltackptIO(repo_path, blocking=False), 4, str(tmp_path / "ckpts"))
    trainer.fit(Tiny(), _loader())
    left = [t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith("deltackpt-save")]
    assert not left, left
    assert sorted({v.step for v in deltackpt.Repo(repo_path).log()}) == [2, 4]
    assert open(tmp_path / "ckpts" / "last.ckpt").read().split()[2] == deltackpt.Repo(repo_path).resolve("ckpt-last").id
    deltackpt.save({"w": torch.ones(4)}, repo_path, step=5, blocking=False).wait()
    assert deltackpt.Repo(repo_path).resolve().step == 5
