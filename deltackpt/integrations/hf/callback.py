"""The observer path: :class:`DeltackptCallback` stores each Trainer save step as a version while
the Trainer goes on writing its own ``checkpoint-N`` folders, and :func:`checkout` writes a version
back as such a folder.  Prefer :class:`~deltackpt.integrations.hf.DeltackptTrainer`, which makes the
repository the Trainer's checkpoint writer (no folder is written, resume reads the repository); the
callback stays for a ``Trainer`` class you cannot change, and for the divergence guard.

Saving: add :class:`DeltackptCallback` to the Trainer.  At each ``on_save`` it stores the model
weights, optimizer, LR scheduler, the TrainerState (as its JSON text), the RNG states and the model
config as one version (:mod:`.layout`; deltas against the previous, unchanged chunks not written),
with ``step`` = ``global_step`` and the metrics logged at that step.  ``remove_hf_checkpoints=True``
then deletes the ``checkpoint-N`` directory the Trainer wrote (after it was written: the Trainer's
bytes are still spent).

``blocking=False`` saves in the background, and lazily (``lazy=True``, the default): the weights
and optimizer state are copied while the next step's forward and backward run, and that step's
``optimizer.step()`` waits for the copy (:mod:`deltackpt.snapshot.lazy`).  The Trainer writes
those tensors only in ``optimizer.step()``; at the end of training (after the last save it may load
the best model into them) the callback waits for the copy inside ``on_save``.  Pass ``lazy=False``
if another callback writes into the weights or optimizer state in place between steps (an EMA
swapped into the live model, ``model.load_state_dict``).

Guarding: ``DeltackptCallback(repo, guard=Guard(watch={"loss": Rules(Spike(), Sustained()),
"grad_norm": Spike(threshold=20)}))`` judges what the Trainer logs (``on_log``: set
``logging_steps=1`` to judge every step; a gradient norm's level rises legitimately early in a
fine-tune, so it gets a spike rule alone).  Watch ``grad_norm`` for
NaNs: the Trainer's default ``logging_nan_inf_filter=True`` logs a NaN loss as the running
average, and without that filter one NaN poisons the Trainer's loss accumulator for the rest of
the run (``tr_loss -= tr_loss`` stays NaN).  When it fires, the model, optimizer, scheduler and
RNG roll back in place to the newest sound version of this repository; the Trainer's step counter
and dataloader go on (the batches since that version are skipped, the schedule resumes from the
version's position), and the restored state is saved as a version at the current step.  The
rollback is logged as one line through transformers' logger (``transformers.deltackpt``, beside
deltackpt's own) and as an entry of ``state.log_history`` (``deltackpt_rollback_to_step``, ...).
Under DDP the callback runs on every rank: each judges what it logs and all roll back together
(:class:`~deltackpt.training.Guard`); the world's process zero saves.

Resuming (deprecated: ``DeltackptTrainer.train(resume_from_checkpoint="latest")`` reads the
repository directly): :func:`checkout` writes a version back as a Trainer checkpoint directory
(``model.safetensors``, ``config.json``, ``optimizer.pt``, ``scheduler.pt``, ``trainer_state.json``,
``rng_state.pth``) and ``trainer.train(resume_from_checkpoint=that_dir)`` resumes exactly as from
the Trainer's own checkpoint.  The ``.pt`` and ``.pth`` files are ``torch.save`` files because that
is what a plain Trainer reads (it loads them with ``weights_only=True``); the repository itself
holds no pickle.

Example::

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[DeltackptCallback("ckpt", remove_hf_checkpoints=True)])
    trainer.train()
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ...api import Repo, internal, load, portable_location, save
from ...deps import require
from ...errors import StateMismatchError
from . import layout

if TYPE_CHECKING:
    from ...api.internal import SaveHandle
    from ...training.guard import Guard

if TYPE_CHECKING:   # the class itself (require() returns a module, typed as any module)
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
else:
    TrainerCallback = require("transformers", feature="deltackpt's transformers callback").TrainerCallback
from transformers.utils import logging as _hf_logging  # noqa: E402  (installed with TrainerCallback)

log = _hf_logging.get_logger("transformers.deltackpt")   # under transformers' handler and verbosity



class DeltackptCallback(TrainerCallback):
    """Store model + optimizer + scheduler + trainer state + RNG at each Trainer save step.

    ``blocking=False`` saves in the background (training waits only for the snapshot); with
    ``lazy=True`` the optimizer's tensors are copied during the next forward/backward (see the
    module docstring for what that asks of other callbacks).
    """

    _state: Any   # the TrainerState last seen (on_train_begin, on_log): what a guard's commit saves

    def __init__(self, repo: "str | os.PathLike | Repo", *, remove_hf_checkpoints: bool = False,
                 blocking: bool = True, encoding: Any = None, lazy: bool = True, guard: "Guard | None" = None) -> None:
        opened = repo if isinstance(repo, Repo) else Repo(repo, create=True)
        self._location = portable_location(opened)
        self._repo: Repo | None = opened
        self._owns_repo = opened is not repo   # opened here from a path: close() closes it
        self.remove_hf_checkpoints = remove_hf_checkpoints
        self.blocking = blocking
        self.encoding = encoding
        self.lazy = lazy
        self.handles: list = []
        if guard is not None and guard.data != "skip":
            raise StateMismatchError("the Trainer's dataloader goes on after a rollback: "
                                     "the guard's data must be 'skip'")
        self.guard = guard
        self._parts: dict[str, Any] = {}

    @property
    def repo(self) -> Repo:
        """The repository, opened in this process at first use."""
        if self._repo is None:
            self._repo, self._owns_repo = Repo(self._location, create=True), True
        return self._repo

    _OPTIONS = ("remove_hf_checkpoints", "blocking", "encoding", "lazy")

    def __getstate__(self) -> dict[str, Any]:
        # only the location and options travel (deepcopy, spawned processes): not the open
        # repository, nor a guard (it holds the live model and its repository's holds)
        return {"location": self._location, **{k: getattr(self, k) for k in self._OPTIONS}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._location, self._repo, self.handles, self._owns_repo = state["location"], None, [], False
        self.guard, self._parts = None, {}
        for k in self._OPTIONS:
            setattr(self, k, state.get(k, True) if k == "lazy" else state[k])   # pickled before "lazy": its default

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: "torch.nn.Module | None" = None, optimizer: "torch.optim.Optimizer | None" = None,
                       lr_scheduler: "torch.optim.lr_scheduler.LRScheduler | None" = None, **kwargs: Any) -> None:
        if self.guard is None:   # every rank runs its guard: under DDP they roll back together

            return
        # the Trainer builds its optimizer and scheduler inside train(): the guard meets them here
        inner = layout.torch_optimizer(optimizer) or optimizer
        guard = self.guard
        guard.parts.model, guard.parts.optimizer, guard.parts.scheduler = model, inner, lr_scheduler
        self._parts = {"model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler}
        self.guard.commit = lambda rb: save(self._snapshot(self._state, **self._parts), self.repo,
                                            step=int(self._state.global_step), encoding=self.encoding,
                                            meta=guard.rollback_meta(rb))
        self._state = state
        self.guard.attach(self.repo, start_step=int(state.global_step) if state.global_step else None)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: "dict[str, float] | None" = None, **kwargs: Any) -> None:
        if self.guard is None or not logs:

            return
        self._state = state
        rb = self.guard.check(int(state.global_step), {k: v for k, v in logs.items() if k in self.guard.rules})
        if rb is not None and state.is_world_process_zero:
            log.warning(rb.message)
            state.log_history.append({"deltackpt_rollback_to_step": rb.step, "deltackpt_bad_since_step": rb.bad_start,
                                      "deltackpt_rollbacks": rb.count, "step": int(state.global_step)})

    @staticmethod
    def _snapshot(state: Any, model: Any = None, optimizer: Any = None, lr_scheduler: Any = None) -> dict[str, Any]:
        return layout.trainer_snapshot(state, model, optimizer, lr_scheduler)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                model: "torch.nn.Module | None" = None, optimizer: "torch.optim.Optimizer | None" = None,
                lr_scheduler: "torch.optim.lr_scheduler.LRScheduler | None" = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        snapshot = self._snapshot(state, model, optimizer, lr_scheduler)
        hooked = layout.torch_optimizer(optimizer) if not self.blocking and self.lazy else None
        lazy = hooked is not None
        result = save(snapshot, self.repo, step=int(state.global_step), metrics=layout.metrics_at_step(state),
                      meta={"hf_output_dir": os.path.abspath(cast(str, args.output_dir))}, encoding=self.encoding,

                      blocking=self.blocking, optimizer=hooked)
        if self.guard is not None:
            self.guard.saved(int(state.global_step), result)
        if not self.blocking:
            self.handles.append(result)
            if lazy and (control.should_training_stop or state.global_step >= state.max_steps):
                # no optimizer.step() follows to wait for the copy, and the Trainer may now load
                # the best checkpoint into these very tensors (load_best_model_at_end)
                cast("SaveHandle", result).wait_snapshot()   # (blocking=False: a handle)
        if self.remove_hf_checkpoints:
            # (output_dir: Optional in TrainingArguments' fields, set by the time the Trainer saves)
            hf_dir = os.path.join(cast(str, args.output_dir), f"checkpoint-{state.global_step}")
            if self.blocking:
                shutil.rmtree(hf_dir, ignore_errors=True)
            else:
                internal.run_after(self.repo, lambda: shutil.rmtree(hf_dir, ignore_errors=True))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.wait()
        if self.guard is not None:
            self.guard.close()
        self.close()   # no thread of ours outlives the training run

    def wait(self) -> None:
        """Wait for background saves; raise their errors."""
        handles, self.handles = self.handles, []
        for h in handles:
            h.wait()

    def close(self) -> None:
        """Wait for background saves, then close the repository handle this callback opened
        (a later save opens it again)."""
        try:
            self.wait()
        finally:
            repo, owned = self._repo, self._owns_repo
            if repo is not None and owned:
                self._repo, self._owns_repo = None, False
                repo.close()


def checkout(repo: "str | os.PathLike | Repo", directory: "str | os.PathLike", version: str = "latest") -> str:
    """Deprecated: resume with :class:`~deltackpt.integrations.hf.DeltackptTrainer` (no folder, no
    pickle) and write a model folder with :func:`~deltackpt.integrations.hf.export`.

    Write ``version`` as a Trainer checkpoint directory and return its path, for a plain
    ``trainer.train(resume_from_checkpoint=...)``.  ``version`` may be any revision
    (``"best:eval_loss"``, a tag, ``"latest~1"``).  The folder is the user's to delete.

    Example: ``trainer.train(resume_from_checkpoint=checkout("ckpt", "resume-dir"))``"""
    from safetensors.torch import save_file

    state, v = load(repo, version, return_version=True)
    if not isinstance(state, dict) or "model" not in state or "trainer_state" not in state:
        raise StateMismatchError(f"version {v.short_id} was not written by DeltackptCallback or DeltackptTrainer")
    out = os.path.abspath(os.fspath(directory))
    os.makedirs(out, exist_ok=True)
    # safetensors refuses tensors sharing storage (tied embeddings): give each its own copy;
    # the Trainer loads with strict=False and ties them again
    save_file({k: t.contiguous().clone() for k, t in state["model"].items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    if "optimizer" in state:
        torch.save(state["optimizer"], os.path.join(out, "optimizer.pt"))
    if "scheduler" in state:
        torch.save(state["scheduler"], os.path.join(out, "scheduler.pt"))
    with open(os.path.join(out, "trainer_state.json"), "w") as f:
        f.write(state["trainer_state"])
    if isinstance(state.get(layout.CONFIG), str):   # so that from_pretrained can read the folder too
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write(state[layout.CONFIG])
    r = state.get("rng")
    if r is not None:
        py, npy = r["python"], r["numpy"]
        hf_rng = {"python": (int(py["version"]), tuple(int(x) for x in py["internal"].tolist()), py["gauss_next"]),
                  "numpy": (npy["kind"], npy["keys"].numpy().astype(np.uint32), int(npy["pos"]),
                            int(npy["has_gauss"]), float(npy["cached_gaussian"])),
                  "cpu": r["torch"]}
        if "cuda" in r:
            hf_rng["cuda"] = r["cuda"]
        torch.save(hf_rng, os.path.join(out, "rng_state.pth"))
    with open(os.path.join(out, "deltackpt.json"), "w") as f:
        json.dump({"repo": repo.location if isinstance(repo, Repo) else portable_location(repo), "version": v.id,
                   "step": v.step}, f)
    return out
