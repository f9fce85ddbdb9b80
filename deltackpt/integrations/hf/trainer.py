"""``DeltackptTrainer``: a ``transformers.Trainer`` whose checkpoints are versions of a deltackpt
repository.  No ``checkpoint-N`` folder is written; ``train(resume_from_checkpoint=...)`` takes a
revision of the repository and resumes from it without pickle and without a folder.

How it plugs in (and why these methods): every save of a Trainer, whatever its strategy, goes
through ``Trainer._save_checkpoint``, and every resume through the path given to ``train()``, which
the Trainer hands to ``_load_from_checkpoint``, ``_load_optimizer_and_scheduler``, ``_load_scaler``
and ``_load_rng_state``; the best model comes back through ``_load_best_model``.  These methods have
kept their names and roles from transformers 4.40 to 5.x (the arguments around them changed: the
overrides take what either passes), while the hooks a ``TrainerCallback`` gets run *after* the
Trainer wrote its folder, and before any callback runs the Trainer has already decided which
batches to skip.  So the mixin overrides those six methods and ``train()``, and nothing else:

- ``_save_checkpoint`` stores :mod:`.layout`'s state as one version (``step`` = ``global_step``,
  ``metrics`` = what was logged at that step) through :func:`deltackpt.save`, blocking or in the
  background (``blocking=False``, lazily by default: see :func:`deltackpt.save`'s ``optimizer``).
- ``train(resume_from_checkpoint=rev)`` loads ``rev`` (``"latest"``, ``True``, a tag,
  ``"best:eval_loss"``, ``"latest~2"``, a version id) and checks it against the model before the
  Trainer starts; the Trainer's own loaders then put the model, optimizer, scheduler, scaler and
  RNG states back from memory.  The one thing the Trainer reads from disk by path is its state
  (``trainer_state.json``: global step, epoch, log history, best metric, callbacks' states), which
  decides how many batches it skips: that JSON text (no pickle) is written into a private
  temporary folder and removed as soon as the Trainer has read it (at ``on_train_begin``).
  A path to an existing folder is a Trainer checkpoint and goes to the Trainer as before.
- ``save_total_limit=N`` becomes ``deltackpt.gc(keep_last=N)`` after each save; the Trainer's best
  version (``metric_for_best_model``) is tagged ``best_tag`` (moved to each new best), and tags
  are kept by gc, as the Trainer keeps its best checkpoint.  ``state.best_model_checkpoint`` holds
  that version's id, and ``load_best_model_at_end`` restores it from the repository in place.

Single process only (no DDP, DeepSpeed or FSDP): each rank would have to store its own RNG state
and shard; :class:`~deltackpt.integrations.hf.DeltackptCallback` observes such runs instead.

Example::

    trainer = DeltackptTrainer(model=model, args=args, train_dataset=ds, repo="ckpt")
    trainer.train()                                   # versions at every save step, no checkpoint-N
    trainer.train(resume_from_checkpoint="latest")    # in a new process, after a kill
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ...api import Repo, gc, load, open_repo, restore, save
from ...deps import require
from ...errors import DeltackptError, InvalidArgumentError, StateMismatchError, UnknownVersionError
from ...format.refs import check_name
from ...training import rng
from ...training.parts import check_parts
from . import layout
from .callback import DeltackptCallback

if TYPE_CHECKING:   # the classes themselves (require() returns a module, typed as any module)
    import torch
    from transformers import Trainer as _TrainerBase   # what the mixin is mixed into
    from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from ...api.internal import SaveHandle, Version
else:
    _TrainerBase = object

transformers = require("transformers", feature="deltackpt's transformers Trainer")
if not TYPE_CHECKING:
    Trainer, TrainerCallback = transformers.Trainer, transformers.TrainerCallback

#: the file the Trainer reads its state from, inside the folder it is given to resume from
TRAINER_STATE_NAME = "trainer_state.json"


@dataclass
class _Resume:
    """A version being resumed: its state in memory, and the folder holding only its
    ``trainer_state.json`` for the Trainer to read (gone once it has)."""

    folder: str
    state: dict[str, Any]
    version: "Version"
    best_model_checkpoint: str | None

    @classmethod
    def open(cls, repo: Repo, revision: Any, model: Any) -> "_Resume":
        """Load ``revision`` and check it against ``model``: a bad revision, a version that is not a
        Trainer checkpoint, or one that does not fit the model raises before anything is written."""
        state, v = load(repo, revision, return_version=True)
        where = f"version {v.short_id}"
        layout.check_trainer_version(state, where)
        check_parts(state, where, {"model": model}, strict=True, rng_too=True)
        try:
            saved = json.loads(state[layout.TRAINER_STATE])
            transformers.TrainerState(**saved)    # what the Trainer will do with it, refused here
        except (ValueError, TypeError) as exc:
            raise StateMismatchError(f"{where}: its trainer_state is not a TrainerState this transformers reads "
                                     f"({type(exc).__name__}: {exc}); nothing was restored") from None
        best = saved.get("best_model_checkpoint")
        if isinstance(v.meta, dict) and v.meta.get("trainer_best"):
            best = v.id       # a version cannot name itself in its own state: its meta says so
        ours = isinstance(best, str) and not os.path.isdir(best)
        if ours:
            # the Trainer drops a best checkpoint that is no folder (with a warning): it is put
            # back once the Trainer has read the state (see _AfterStateLoaded)
            saved["best_model_checkpoint"] = None
            try:
                best = repo.resolve(best).id
            except DeltackptError:
                best = None   # removed since, or a Trainer folder deleted since: forgotten, as the Trainer does
        folder = tempfile.mkdtemp(prefix="deltackpt-resume-")
        with open(os.path.join(folder, TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
            f.write(json.dumps(saved, indent=2, sort_keys=True) + "\n")
        return cls(folder, state, v, best if ours else saved.get("best_model_checkpoint"))

    def remove_folder(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def apply(self, trainer: Any) -> None:
        """Model, optimizer, scheduler and scaler from the version, all or nothing: each is checked
        against its live object (which the Trainer has just built) before the first is written."""
        state = self.state
        parts: dict[str, Any] = {"model": trainer.model}
        scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
        for name, target in ((layout.OPTIMIZER, trainer.optimizer), (layout.SCHEDULER, trainer.lr_scheduler),
                             (layout.SCALER, scaler)):
            if name in state and target is not None:   # absent when saved with save_only_model
                parts[name] = target
        check_parts(state, f"version {self.version.short_id}", parts, strict=True, rng_too=True)
        for name, target in parts.items():
            target.load_state_dict(state[name])


class _AfterStateLoaded(TrainerCallback):
    """``on_train_begin`` comes after the Trainer has read the resumed state in every version of
    transformers: the temporary folder goes, and the best version is named again."""

    def __init__(self, trainer: "DeltackptTrainerMixin") -> None:
        self._trainer = weakref.ref(trainer)   # the Trainer holds this callback: no cycle

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        trainer = self._trainer()
        resume = trainer._deltackpt_resume if trainer is not None else None
        if resume is None:
            return
        if not args.auto_find_batch_size:   # a retry with a smaller batch reads the state again
            resume.remove_folder()
        state.best_model_checkpoint = resume.best_model_checkpoint


class DeltackptTrainerMixin(_TrainerBase):
    """Makes a ``transformers.Trainer`` (or a subclass: ``Seq2SeqTrainer``, trl's ``SFTTrainer``)
    save its checkpoints as versions of the deltackpt repository ``repo`` and resume from them.

    ``repo``: a path, URL or :class:`deltackpt.Repo` (created if missing).  ``blocking=False``
    saves in the background: training waits only for the snapshot, and with ``lazy=True`` not
    even for the weights and optimizer state, which are copied during the next forward and
    backward (pass ``lazy=False`` if a callback writes into them in place between steps).
    ``encoding``: lossy modes by tensor name pattern, as :func:`deltackpt.save` takes them.
    ``best_tag``: the tag naming the Trainer's best version (``metric_for_best_model``); None
    tags nothing (``save_total_limit`` then no longer protects the best version).

    Example::

        class MySFTTrainer(DeltackptTrainerMixin, SFTTrainer):
            pass

        trainer = MySFTTrainer(model=model, args=args, train_dataset=ds, repo="ckpt")
        trainer.train(resume_from_checkpoint=True)    # True: the repository's latest version
    """

    def __init__(self, *args: Any, repo: "str | os.PathLike | Repo", blocking: bool = True, lazy: bool = True,
                 encoding: Any = None, best_tag: str | None = "trainer-best", **kwargs: Any) -> None:
        for name, flag in (("blocking", blocking), ("lazy", lazy)):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False, got {flag!r:.80}")
        if best_tag is not None:
            check_name(best_tag)
        self._deltackpt_resume: _Resume | None = None
        self._deltackpt_in_flight: "tuple[SaveHandle, bool] | None" = None
        super().__init__(*args, **kwargs)
        if any(isinstance(cb, DeltackptCallback) for cb in self.callback_handler.callbacks):
            raise InvalidArgumentError("DeltackptTrainer saves into its repository itself: remove the "
                                       "DeltackptCallback (it would save every step twice)")
        self.checkpoint_repo = open_repo(repo, create=True)
        self.checkpoint_blocking, self.checkpoint_lazy = blocking, lazy
        self.checkpoint_encoding, self.checkpoint_best_tag = encoding, best_tag
        self.add_callback(_AfterStateLoaded(self))

    # training ---------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: Any = None, trial: Any = None, ignore_keys_for_eval: Any = None,
              **kwargs: Any) -> Any:
        """``Trainer.train``, where ``resume_from_checkpoint`` names a version of the repository:
        ``"latest"`` or ``True``, a tag, ``"best:eval_loss"``, ``"latest~1"``, an id or a
        :class:`deltackpt.Version`.  A path to an existing folder is a Trainer checkpoint, loaded
        by the Trainer as before (a run moving over from the Trainer's own checkpoints).  Returns
        once every save of the run is in the repository.

        Example: ``trainer.train(resume_from_checkpoint="best:eval_loss")``"""
        self._deltackpt_check_supported()
        target = resume_from_checkpoint
        resume = None
        folder = isinstance(resume_from_checkpoint, (str, os.PathLike)) and os.path.isdir(resume_from_checkpoint)
        if resume_from_checkpoint is not None and resume_from_checkpoint is not False and not folder:
            revision = "latest" if resume_from_checkpoint is True else resume_from_checkpoint
            resume = _Resume.open(self.checkpoint_repo, revision, self.model)
            target = resume.folder
        self._deltackpt_resume = resume
        try:
            output = super().train(resume_from_checkpoint=target, trial=trial,
                                   ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        except BaseException:
            self._deltackpt_finish(raise_errors=False)   # a save in flight still lands; the run's error wins
            raise
        finally:
            if resume is not None:
                resume.remove_folder()
            self._deltackpt_resume = None
        self._deltackpt_finish()
        return output

    def _deltackpt_check_supported(self) -> None:
        args = self.args
        sharded = [n for n in ("deepspeed", "fsdp") if getattr(self, f"is_{n}_enabled", False)]
        if sharded or args.world_size > 1:
            raise InvalidArgumentError(
                f"DeltackptTrainer saves single-process training; this run has world_size={args.world_size}"
                f"{' and ' + '/'.join(sharded) if sharded else ''}: use the Trainer's own checkpoints "
                "(DeltackptCallback can observe them)")

    # saving -----------------------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
        """Store this save step as a version (the Trainer's folder is not written).  transformers
        before 4.47 passes the evaluation ``metrics`` here and judges the best model in this method."""
        metrics = kwargs.get("metrics", args[0] if args else None)
        targs, state = self.args, self.state
        if getattr(self, "hp_search_backend", None) is None and trial is None:
            self.store_flos()
        self._deltackpt_settle()    # the previous background save: its error surfaces here
        best = self._deltackpt_is_new_best(metrics, trial)
        self._deltackpt_export_callback_states()
        everything = not getattr(targs, "save_only_model", False)
        scaler = getattr(self.accelerator, "scaler", None) if everything else None
        snapshot = layout.trainer_snapshot(state, self.model,
                                           self.optimizer if everything else None,
                                           self.lr_scheduler if everything else None,
                                           scaler, capture_rng=everything)
        lazy = None
        if not self.checkpoint_blocking and self.checkpoint_lazy:
            lazy = layout.torch_optimizer(self.optimizer)
        run_dir = self._get_output_dir(trial=trial)
        result = save(snapshot, self.checkpoint_repo, step=int(state.global_step),
                      metrics=layout.metrics_at_step(state),
                      meta={"hf_output_dir": os.path.abspath(run_dir), "trainer_best": best},
                      encoding=self.checkpoint_encoding, blocking=self.checkpoint_blocking, optimizer=lazy)
        if self.checkpoint_blocking:
            self._deltackpt_committed(cast("Version", result), best)
            return
        result = cast("SaveHandle", result)
        self._deltackpt_in_flight = (result, best)
        if lazy is not None and (self.control.should_training_stop
                                 or state.global_step >= state.max_steps):
            # no optimizer.step() follows to wait for the copy, and the Trainer may now load the
            # best model into these very tensors
            result.wait_snapshot()

    def _deltackpt_is_new_best(self, metrics: Any, trial: Any) -> bool:
        """Whether this save is the Trainer's new best model.  transformers 5.x (and 4.5x) record
        the step of the best evaluation (``best_global_step``); 4.47-4.4x point
        ``best_model_checkpoint`` at the folder they would write now; before 4.47 the Trainer
        judged in ``_save_checkpoint`` itself, which this then does as it did."""
        targs, state = self.args, self.state
        if metrics is not None and targs.metric_for_best_model is not None:
            name = targs.metric_for_best_model
            value = metrics[name if name.startswith("eval_") else f"eval_{name}"]
            better = np.greater if targs.greater_is_better else np.less
            if state.best_metric is None or better(value, state.best_metric):
                state.best_metric = value
                return True
            return False
        step = state.global_step
        if getattr(state, "best_global_step", None) is not None:
            return bool(state.best_global_step == step)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{step}")
        return state.best_model_checkpoint == folder

    def _deltackpt_export_callback_states(self) -> None:
        """What the Trainer does before writing its state: each stateful callback's (and the
        control's) current state goes into ``state.stateful_callbacks``."""
        exportable = getattr(importlib.import_module("transformers.trainer_callback"), "ExportableState", None)
        if exportable is None:   # transformers before 4.41 has no stateful callbacks
            return
        # annotated as a list: TrainerState turns the list it is given into {class name: state}
        stored = cast("dict[str, Any]", self.state.stateful_callbacks)
        for cb in [*self.callback_handler.callbacks, self.control]:
            if isinstance(cb, exportable):
                name = type(cb).__name__
                if isinstance(stored.get(name), list):
                    stored[name].append(cb.state())
                else:
                    stored[name] = cb.state()

    def _deltackpt_settle(self, raise_errors: bool = True) -> None:
        """Wait for the background save in flight (if any), then do what follows a committed one."""
        pending, self._deltackpt_in_flight = self._deltackpt_in_flight, None
        if pending is None:
            return
        handle, best = pending
        try:
            version = handle.wait()
        except BaseException:
            if raise_errors:
                raise
            return
        self._deltackpt_committed(version, best)

    def _deltackpt_committed(self, version: "Version", best: bool) -> None:
        """A version is in the repository: name it as the best if it is, then apply the Trainer's
        retention (``save_total_limit`` newest versions, and the tagged best)."""
        if best:
            self.state.best_model_checkpoint = version.id
            if self.checkpoint_best_tag is not None:
                self.checkpoint_repo.tag(self.checkpoint_best_tag, version, force=True)
        limit = self.args.save_total_limit
        if limit is not None and limit > 0:
            gc(self.checkpoint_repo, keep_last=limit)

    def _deltackpt_finish(self, raise_errors: bool = True) -> None:
        try:
            self._deltackpt_settle(raise_errors)
        finally:
            # the handle's background work is done and its save thread joined: nothing of ours
            # outlives train() (the handle itself stays open for evaluate/save_model/a second train)
            try:
                self.checkpoint_repo.wait()
            except BaseException:
                if raise_errors:
                    raise

    # resuming ---------------------------------------------------------------------------------
    def _deltackpt_resuming(self, checkpoint: Any) -> "_Resume | None":
        resume = self._deltackpt_resume
        return resume if resume is not None and checkpoint == resume.folder else None

    def _load_from_checkpoint(self, resume_from_checkpoint: Any, model: Any = None) -> None:
        if self._deltackpt_resuming(resume_from_checkpoint) is None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        # else: the model is written with the optimizer, once every part has been checked

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        resume = self._deltackpt_resuming(checkpoint)
        if resume is None:
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        resume.apply(self)

    def _load_scaler(self, checkpoint: Any) -> None:
        if self._deltackpt_resuming(checkpoint) is None:
            super()._load_scaler(checkpoint)
        # else: loaded with the optimizer

    def _load_rng_state(self, checkpoint: Any) -> None:
        resume = self._deltackpt_resuming(checkpoint)
        if resume is None:
            super()._load_rng_state(checkpoint)
        elif layout.RNG in resume.state:
            rng.restore(resume.state[layout.RNG])

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if best is None or os.path.isdir(best):   # a Trainer folder: a run resumed from one
            super()._load_best_model()
            return
        self._deltackpt_settle()
        try:
            restore(cast("torch.nn.Module", self.model), self.checkpoint_repo, best)
        except UnknownVersionError as exc:   # removed meanwhile (a gc by hand): the Trainer warns and goes on
            warnings.warn(f"load_best_model_at_end: the best version is gone ({exc}); the model stays as trained",
                          RuntimeWarning, stacklevel=2)


class DeltackptTrainer(DeltackptTrainerMixin, Trainer):
    """``transformers.Trainer`` saving into and resuming from a deltackpt repository (see the module
    docstring); takes the Trainer's arguments and ``repo=`` (plus ``blocking``, ``lazy``,
    ``encoding``, ``best_tag``: :class:`DeltackptTrainerMixin`).

    Example::

        trainer = DeltackptTrainer(model=model, args=args, train_dataset=ds, repo="ckpt")
        trainer.train(resume_from_checkpoint=True)     # the latest version, if training resumes
        export("ckpt", "model-out", tokenizer=tokenizer)   # a from_pretrained folder
    """

