"""The divergence guard inside real Trainers: transformers' Trainer through DeltackptCallback(guard=)
and Lightning's through the DeltackptGuard callback.  A callback poisons the weights with NaN
mid-run; the guard rolls model, optimizer and scheduler back in place (bit-identical to
deltackpt.load of the target), records the event, and the run finishes with finite weights."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys

import pytest
import torch

import deltackpt
from deltackpt.repo.maintain import events
from deltackpt.training import Guard
from tests.conftest import ROOT
from tests.strategies import assert_bit_identical

POISON_AT = 9   # the weights turn NaN before step 10: its loss and gradient norm are NaN


def _finite(module: torch.nn.Module) -> bool:
    return all(torch.isfinite(p).all() for p in module.parameters())


class _Lines(logging.Handler):
    """The lines a logger emits (the frameworks' loggers do not propagate to the root's handlers)."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self.logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> "_Lines":
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)


def _same_as_target(repo_path, rb, model, optimizer, scheduler) -> None:
    saved = deltackpt.load(repo_path, rb.version.id)
    assert_bit_identical(saved["model"], model.state_dict(), "model")
    assert_bit_identical(saved["optimizer"], optimizer.state_dict(), "optimizer")
    assert saved["scheduler"] == scheduler.state_dict()


def test_transformers_trainer_rolls_back_on_nan(tmp_path, repo_path):
    transformers = pytest.importorskip("transformers")
    from deltackpt.integrations.hf import DeltackptCallback
    from tests.integrations.test_hf import _data, _model

    guard = Guard(watch=["loss", "grad_norm"])
    checked = []

    class Poison(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == POISON_AT and not guard.rollbacks:
                with torch.no_grad():
                    model.classifier.weight.mul_(math.nan)

    class Check(transformers.TrainerCallback):   # runs after the guard's on_log
        def on_log(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            if guard.rollbacks and not checked:
                _same_as_target(repo_path, guard.rollbacks[0], model, optimizer, lr_scheduler)
                checked.append(state.global_step)

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=16, save_steps=4,
                                          save_strategy="steps", per_device_train_batch_size=4, learning_rate=1e-3,
                                          report_to=[], use_cpu=True, logging_steps=1,
                                          seed=3, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=_data(),
                                   callbacks=[DeltackptCallback(repo_path, remove_hf_checkpoints=True, guard=guard),
                                              Poison(), Check()])
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_warning()   # the default (a MiniLM test before may have quieted it)
    try:
        with _Lines("transformers.deltackpt") as framework, _Lines("deltackpt") as ours:
            trainer.train()
    finally:
        transformers.utils.logging.set_verbosity(verbosity)
    (rb,) = guard.rollbacks
    assert framework.lines == ours.lines == [rb.message]           # one line, through both loggers
    (entry,) = [e for e in trainer.state.log_history if "deltackpt_rollback_to_step" in e]
    assert (entry["deltackpt_rollback_to_step"], entry["step"]) == (8, POISON_AT + 1)
    assert (rb.from_step, rb.version.step, rb.verdict.rule) == (POISON_AT + 1, 8, "nonfinite")
    assert checked == [POISON_AT + 1] and trainer.state.global_step == 16 and _finite(trainer.model)
    assert rb.committed is not None and rb.committed.step == POISON_AT + 1
    (e,) = events.usable(deltackpt.Repo(repo_path).core, "rollback")
    assert e.data["to_step"] == 8 and e.data["committed"] == rb.committed.id


def test_lightning_guard_callback_rolls_back_on_nan(tmp_path, repo_path):
    pl = pytest.importorskip("pytorch_lightning")
    from deltackpt.integrations.lightning import DeltackptGuard
    from tests.integrations.test_lightning import Tiny, _loader

    guard = Guard()
    checked = []

    class Poison(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == POISON_AT and not guard.rollbacks:
                with torch.no_grad():
                    pl_module.net[0].weight.mul_(math.nan)

    class Check(pl.Callback):   # after the guard's callback
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if guard.rollbacks and not checked:
                _same_as_target(repo_path, guard.rollbacks[0], pl_module, trainer.optimizers[0],
                                trainer.lr_scheduler_configs[0].scheduler)
                checked.append(trainer.global_step)

    torch.manual_seed(0)
    model = Tiny()
    trainer = pl.Trainer(max_steps=16, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                         callbacks=[DeltackptGuard(repo_path, guard, every_n_steps=4), Poison(), Check()])
    with _Lines("pytorch_lightning.callbacks.deltackpt") as framework, _Lines("deltackpt") as ours:
        trainer.fit(model, _loader())
    (rb,) = guard.rollbacks
    assert framework.lines == ours.lines == [rb.message]
    assert (rb.from_step, rb.version.step, rb.verdict.rule) == (POISON_AT + 1, 8, "nonfinite")
    assert checked == [POISON_AT + 1] and trainer.global_step == 16 and _finite(model)
    assert [e.kind for e in deltackpt.Repo(repo_path).events()] == ["rollback"]


@pytest.mark.slow
def test_lightning_ddp_ranks_roll_back_together(tmp_path, repo_path):
    """Lightning's own DDP launcher, 2 CPU processes: rank 1's weights turn NaN before step 10, rank
    0's do not; both roll back at step 10 to the version of step 8 and end with the same weights
    (rank 0 commits).  The fast path's tests/training/test_guard_ddp.py checks the same agreement
    without Lightning."""
    pytest.importorskip("pytorch_lightning")
    deltackpt.Repo.init(repo_path)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": ROOT, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.integrations.lightning_ddp_child", repo_path, str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    (a,), (b,) = r0["rollbacks"], r1["rollbacks"]
    assert (a["from_step"], a["step"], a["seen_on"]) == (b["from_step"], b["step"], b["seen_on"])
    assert (a["from_step"], a["step"], a["seen_on"]) == (POISON_AT + 1, 8, 1)
    assert a["version"] == b["version"] and a["committed"] is not None and b["committed"] is None
    assert r0["weights"] == r1["weights"] and r0["global_step"] == r1["global_step"] == 16
