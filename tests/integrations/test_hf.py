"""transformers.Trainer: DeltackptCallback stores each save step; checkout() + resume_from_checkpoint resumes."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")

import deltackpt  # noqa: E402
from deltackpt.errors import StateMismatchError  # noqa: E402
from deltackpt.integrations.hf import DeltackptCallback, checkout  # noqa: E402
from tests.strategies import assert_bit_identical, clone_state  # noqa: E402


class Crash(transformers.TrainerCallback):
    """Raises after a given step, as a killed job would stop there."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt(f"crash at step {self.at}")


def _model():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return transformers.BertForSequenceClassification(cfg)


def _data():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (48, 8), generator=g)
    return [{"input_ids": ids[i], "labels": int(ids[i].sum()) % 2} for i in range(48)]


def _trainer(tmp_path, callbacks, out="out"):
    args = transformers.TrainingArguments(output_dir=str(tmp_path / out), max_steps=8, save_steps=4,
                                          save_strategy="steps", per_device_train_batch_size=4, learning_rate=1e-3,
                                          report_to=[], use_cpu=True, logging_steps=2, seed=3,
                                          dataloader_num_workers=0, disable_tqdm=True)
    return transformers.Trainer(model=_model(), args=args, train_dataset=_data(), callbacks=callbacks)


def test_trainer_saves_into_repository_and_resumes_exactly(tmp_path, repo_path):
    """A Trainer crashed after step 6 resumes from the repository's step-4 version and ends with the
    same weights as an uninterrupted run; HF's own checkpoint directories are removed."""
    straight = _trainer(tmp_path, [], out="straight")
    straight.train()
    expected = {k: v.clone() for k, v in straight.model.state_dict().items()}

    crashed = _trainer(tmp_path, [DeltackptCallback(repo_path, remove_hf_checkpoints=True), Crash(6)])
    with pytest.raises(KeyboardInterrupt):
        crashed.train()
    log = deltackpt.Repo(repo_path).log()
    assert [v.step for v in log] == [4] and "loss" in log[0].metrics
    assert not [d for d in os.listdir(tmp_path / "out") if d.startswith("checkpoint-")]

    resumed = _trainer(tmp_path, [DeltackptCallback(repo_path, remove_hf_checkpoints=True)])
    resumed.train(resume_from_checkpoint=checkout(repo_path, tmp_path / "resume"))
    assert resumed.state.global_step == 8
    assert sorted(v.step for v in deltackpt.Repo(repo_path).log()) == [4, 8]
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, expected[k]), k


def test_checkout_refuses_foreign_versions(tmp_path, repo_path):
    """checkout() of a version not written by the callback raises StateMismatchError naming it."""
    deltackpt.save({"w": torch.ones(2)}, repo_path, step=1)
    with pytest.raises(StateMismatchError, match="DeltackptCallback"):
        checkout(repo_path, tmp_path / "x")


@pytest.fixture
def held_copies(monkeypatch):
    """The first lazy copy waits for a gate (then 0.3 s more), later ones sleep 0.3 s before copying:
    a copy that the optimizer or the Trainer did not wait for would read later values."""
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


class Record(transformers.TrainerCallback):
    """Placed before DeltackptCallback: clones model and optimizer state at each save, and, just
    before the next optimizer step, notes whether that save's snapshot was still pending (then
    opens the gate that holds the first lazy copy)."""

    def __init__(self, cb: DeltackptCallback, gate: threading.Event) -> None:
        self.cb, self.gate = cb, gate
        self.at: dict[int, dict] = {}
        self.pending: list[bool] = []

    def on_save(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.at[state.global_step] = clone_state({"model": model.state_dict(), "optimizer": optimizer.state_dict()})

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.cb.handles and not self.gate.is_set():
            self.pending.append(not self.cb.handles[-1].snapshot_done())
            self.gate.set()


def _saved(repo_path) -> dict[int, dict]:
    return {v.step: deltackpt.load(repo_path, v.id) for v in deltackpt.Repo(repo_path).log()}


def test_background_callback_snapshots_lazily_and_saves_the_state_at_the_save(tmp_path, repo_path, held_copies):
    """With blocking=False the callback's snapshot of weights and optimizer is still pending when the
    Trainer's next step has run forward and backward, and each saved version is bit-identical to
    the model and optimizer state at its save although training went on."""
    cb = DeltackptCallback(repo_path, blocking=False)
    rec = Record(cb, held_copies)
    trainer = _trainer(tmp_path, [rec, cb])
    trainer.train()
    assert rec.pending == [True]
    saved = _saved(repo_path)
    assert sorted(saved) == [4, 8]
    for step in (4, 8):
        assert_bit_identical(rec.at[step], {"model": saved[step]["model"], "optimizer": saved[step]["optimizer"]}, f"step {step}")
    assert not torch.equal(trainer.model.classifier.weight, rec.at[4]["model"]["classifier.weight"])


def test_last_lazy_save_is_copied_before_the_trainer_loads_the_best_model(tmp_path, repo_path, held_copies):
    """The last save of a run is copied inside on_save: load_best_model_at_end writes the best
    checkpoint's weights into the live model right after it, and the step-8 version still holds
    step 8's weights."""

    class Rank(transformers.TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            metrics["eval_rank"] = -state.global_step   # step 4 is the best checkpoint

    cb = DeltackptCallback(repo_path, blocking=False)
    rec = Record(cb, held_copies)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=8, save_steps=4, save_strategy="steps", eval_strategy="steps",
        eval_steps=4, load_best_model_at_end=True, metric_for_best_model="rank", greater_is_better=True,
        per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], use_cpu=True, seed=3,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=_data(), eval_dataset=_data()[:8],
                                   callbacks=[Rank(), rec, cb])
    trainer.train()
    assert_bit_identical(rec.at[4]["model"], trainer.model.state_dict(), "best model loaded")
    assert_bit_identical(rec.at[8]["model"], _saved(repo_path)[8]["model"], "step 8")
