"""transformers.Trainer: DeltackptCallback stores each save step; checkout() + resume_from_checkpoint resumes."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

import deltackpt  # noqa: E402
from deltackpt.errors import StateMismatchError  # noqa: E402
from deltackpt.frontend.adapters.hf import DeltackptCallback, checkout  # noqa: E402


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
