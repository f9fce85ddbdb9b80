"""What a Lightning checkpoint's version records besides its step: metrics.

Two sources, both read from the checkpoint dict Lightning hands to ``CheckpointIO.save_checkpoint``
(which never sees the trainer):

- :func:`monitored_score`: the score ``ModelCheckpoint`` ranked a top-k file by, from its own state
  in the checkpoint (always there, whatever the callbacks);
- :class:`DeltackptMetrics`: a callback that puts ``trainer.callback_metrics`` into the checkpoint
  under :data:`METRICS_KEY` at the moment Lightning makes it (Lightning's public
  ``on_save_checkpoint`` hook), so the record is taken on the right trainer at the right step
  even when the save runs later in the background.

Why a callback and not a ``ModelCheckpoint`` subclass: it composes with any number of
ModelCheckpoints and with ``trainer.save_checkpoint(...)``, and it needs nothing of
ModelCheckpoint's private methods.  Why the checkpoint dict and not a link from the callback to the
plugin: the dict is what reaches the plugin whatever wraps it (``AsyncCheckpointIO`` calls it later,
from a thread, when ``callback_metrics`` has moved on).

Example::

    trainer = pl.Trainer(plugins=[DeltackptIO("ckpt")],
                         callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=3), DeltackptMetrics()])
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from ..deps import require

__all__ = ["METRICS_KEY", "DeltackptMetrics", "monitored_score", "plain_metrics"]

if TYPE_CHECKING:   # the class itself (require() returns a module, typed as any module)
    from pytorch_lightning import Callback
else:
    Callback = require("pytorch_lightning", feature="deltackpt's Lightning metrics").Callback

METRICS_KEY = "deltackpt_metrics"
"""Where :class:`DeltackptMetrics` puts the metrics in the checkpoint dict; DeltackptIO records
them on the version and does not store them in the state."""


def _number(value: Any) -> "int | float | None":
    """A logged value as a plain number (a one-element tensor, an int or a float), else None."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            return None
        value = value.detach().cpu().reshape(()).item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def plain_metrics(metrics: Any) -> dict[str, "int | float"]:
    """``trainer.callback_metrics`` (name -> 0-d tensor) as name -> number; what is not one number
    (Lightning logs only scalars) is left out."""
    out: dict[str, int | float] = {}
    for name, value in (metrics or {}).items():
        number = _number(value)
        if isinstance(name, str) and number is not None:
            out[name] = number
    return out


def monitored_score(checkpoint: dict[str, Any], path: str, local: bool) -> dict[str, "int | float"]:
    """The score a ModelCheckpoint ranked this file by.  Its state in the checkpoint maps every
    top-k file to its score (``best_k_models``, set before the file is saved); ``monitor`` names it.
    ModelCheckpoint keys local files by their real path; a save of the same file by another
    spelling of its path (a relative one, re-saving a converted file) finds its score too."""
    out: dict[str, int | float] = {}
    states = checkpoint.get("callbacks")
    real = os.path.realpath(path) if local else path
    for state in (states.values() if isinstance(states, dict) else ()):
        if not isinstance(state, dict):
            continue
        monitor, scores = state.get("monitor"), state.get("best_k_models")
        if not (isinstance(monitor, str) and isinstance(scores, dict)):
            continue
        key = path if path in scores else next(
            (k for k in scores if local and isinstance(k, str) and os.path.realpath(k) == real), None)
        number = _number(scores[key]) if key is not None else None
        if number is not None:
            out[monitor] = number
    return out


class DeltackptMetrics(Callback):
    """A Lightning callback that puts ``trainer.callback_metrics`` (everything logged with
    ``self.log``, as numbers) into every checkpoint Lightning saves, so that the version
    :class:`DeltackptIO` makes of it records them: ``best:val_loss``, ``deltackpt log`` and
    ``gc(keep_best=...)`` then see every metric at every saved step, ``last.ckpt`` included.

    It uses Lightning's public ``on_save_checkpoint`` hook, so the metrics are read at the moment
    the checkpoint is made, on the trainer that makes it, whichever callback or call asked for the
    save.  DeltackptIO takes them out of the stored state (with another CheckpointIO they stay in
    the file under ``"deltackpt_metrics"``).  A ``save_weights_only=True`` checkpoint
    holds no callback state and Lightning calls no callback for it: those versions record no
    metrics (their step and epoch only).

    Example::

        trainer = pl.Trainer(plugins=[DeltackptIO("ckpt")],
                             callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=3), DeltackptMetrics()])
        trainer.fit(model)
        deltackpt.Repo("ckpt").resolve("best:val_loss").metrics    # {"val_loss": ..., "train_loss": ...}
    """

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[METRICS_KEY] = plain_metrics(trainer.callback_metrics)
