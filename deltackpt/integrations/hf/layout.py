"""What a ``transformers.Trainer`` checkpoint is inside a deltackpt version.

One version holds, as one nested state (each key a top-level name, so ``layers=["model"]`` reads the
weights alone):

- ``model``: the model's ``state_dict()``;
- ``optimizer``, ``scheduler``, ``scaler``: their ``state_dict()`` (absent with ``save_only_model``);
- ``rng``: :func:`deltackpt.training.rng.capture` (python, numpy, torch CPU, CUDA when initialised);
- ``trainer_state``: the ``TrainerState`` as the JSON text ``TrainerState.save_to_json`` writes;
- ``hf_config``: the model config's JSON text as ``config.json`` would hold it (what
  :func:`~deltackpt.integrations.hf.export` writes for ``from_pretrained``).

Its ``step`` is ``global_step`` and its ``metrics`` are what the Trainer logged at that step
(``loss``, ``eval_loss``, ...), so ``best:eval_loss`` ranks versions by their own evaluation.
:class:`~deltackpt.integrations.hf.DeltackptTrainer` and the older
:class:`~deltackpt.integrations.hf.DeltackptCallback` write the same layout, so either's versions
resume with the Trainer subclass and export alike.

Example::

    state = trainer_snapshot(trainer.state, model, optimizer, scheduler)
    deltackpt.save(state, "ckpt", step=trainer.state.global_step, metrics=metrics_at_step(trainer.state))
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from ...errors import StateMismatchError
from ...training import rng

MODEL, OPTIMIZER, SCHEDULER, SCALER, RNG = "model", "optimizer", "scheduler", "scaler", "rng"
TRAINER_STATE, CONFIG = "trainer_state", "hf_config"


def trainer_snapshot(state: Any, model: Any, optimizer: Any = None, lr_scheduler: Any = None, scaler: Any = None,
                     *, capture_rng: bool = True) -> dict[str, Any]:
    """The state one version holds (see the module docstring); the parts given as None are left out."""
    if model is None:
        raise StateMismatchError("the Trainer passed no model to save")
    snapshot: dict[str, Any] = {MODEL: model.state_dict(), TRAINER_STATE: state_json(state)}
    for name, part in ((OPTIMIZER, optimizer), (SCHEDULER, lr_scheduler), (SCALER, scaler)):
        if part is not None:
            snapshot[name] = part.state_dict()
    if capture_rng:
        snapshot[RNG] = rng.capture()
    config = config_json(model)
    if config is not None:
        snapshot[CONFIG] = config
    return snapshot


def state_json(state: Any) -> str:
    """The same text ``TrainerState.save_to_json`` writes into ``trainer_state.json``."""
    return json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"


def config_json(model: Any) -> str | None:
    """``config.json`` as ``model.save_pretrained`` writes it (``architectures`` names the model's
    class, which ``AutoModel*.from_pretrained`` reads), or None for a model without a transformers
    config."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        return None
    data = json.loads(config.to_json_string())
    data["architectures"] = [type(model).__name__]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def metrics_at_step(state: Any) -> dict[str, float]:
    """The numbers the Trainer logged at ``state.global_step`` (training loss, learning rate, an
    evaluation's ``eval_*``): a version records its own step's metrics, never an earlier step's
    evaluation, so ``best:eval_loss`` compares evaluations of the versions themselves."""
    out: dict[str, float] = {}
    for entry in state.log_history:
        if entry.get("step") != state.global_step:
            continue
        out.update({k: v for k, v in entry.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"})
    return out


def check_trainer_version(state: Any, where: str) -> None:
    """Refuse a version that is not a Trainer checkpoint (no ``model`` or ``trainer_state``)."""
    if not isinstance(state, dict) or not isinstance(state.get(MODEL), dict) \
            or not isinstance(state.get(TRAINER_STATE), str):
        raise StateMismatchError(f"{where} is not a Trainer checkpoint (it holds no 'model' and 'trainer_state' "
                                 "entries: was it written by DeltackptTrainer or DeltackptCallback?)")


def torch_optimizer(optimizer: Any) -> "torch.optim.Optimizer | None":
    """The optimizer whose ``step()`` writes the tensors, or None where there is no such torch
    optimizer with step hooks (no optimizer, DeepSpeed's own): a snapshot is then eager.
    accelerate's ``AcceleratedOptimizer`` (what the Trainer holds) calls its inner optimizer's
    ``step()``, whose hooks are the ones that run."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    hooked = isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "_optimizer_step_pre_hooks")
    return optimizer if hooked else None
