"""PyTorch Lightning: store every checkpoint Lightning writes in a deltackpt repository.

``Trainer(plugins=[DeltackptIO("ckpt")])`` routes each ``ModelCheckpoint`` save through
:meth:`DeltackptIO.save_checkpoint`: the checkpoint dict becomes a new version (deltas against
the previous one, unchanged chunks not written), and a small pointer file is written at the path
Lightning asked for (``deltackpt <repo> <version id>``), so Lightning's own file logic (top-k
bookkeeping, ``ckpt_path="last"``, ``best_model_path``) keeps working.  ``trainer.fit(model,
ckpt_path=path)`` loads the version the pointer names; ``ckpt_path`` may also be a revision of
the repository itself (``"latest"``, a tag, ``"best:val_loss"``, an id prefix).
Each version records ``step``, ``epoch`` (meta) and metrics: the score ``ModelCheckpoint``
ranked a top-k file by (read from its own state in the checkpoint), and, with
:class:`DeltackptMetrics` in the callbacks, every metric in ``trainer.callback_metrics`` at the
moment of the save; so ``best:val_loss`` and ``gc(keep_best=...)`` work on Lightning runs.

Files and versions: every pointer file has a tag naming its version, ``ckpt-<file name>``
(``ckpt-last`` for ``last.ckpt``; a second folder writing the same file name into the repository
gets ``ckpt-<name>-<hash of its path>``).  When Lightning overwrites a file or removes it (top-k
rotation), the tag goes with it: the version stays, untagged, until ``deltackpt gc`` (which keeps
tagged versions) removes it.  So ``gc(keep_last=0)`` keeps exactly what ModelCheckpoint keeps.
A file that is not a pointer (a ``.ckpt`` written by ``torch.save`` before the switch) is read
with torch's weights-only loader, so a run resumes from its old checkpoint files.
The one file that is not a checkpoint, the spawn launchers' hand-back of rank 0's final weights
to the main process (``.temp.ckpt``, written, read and removed within one ``fit``), is written
as Lightning's own ``TorchCheckpointIO`` writes it, not committed as a version.

What a Lightning checkpoint holds besides tensors is stored as plain data, without pickle:
config objects (OmegaConf, ``argparse.Namespace``, dataclasses, enums, ``AttributeDict``, the
``hparams_type`` class) with a small type tag, rebuilt at load from an allow-list only; see
:mod:`deltackpt.integrations.plain`.  Every conversion is listed in the version's meta
(``converted``).  Anything else (an arbitrary object in ``hyper_parameters``, say) raises
:class:`~deltackpt.UnsupportedLeafError` naming its key: nothing is dropped or pickled silently.

Paths: pointer files go through fsspec, as Lightning's own files do, so ``ModelCheckpoint(dirpath=
"s3://bucket/ckpts")`` or ``"memory://ckpts"`` work (the repository itself may be local or a URL).
The plugin pickles as its repository's location and options (``ddp_spawn``, ``torch.save(trainer)``,
``deepcopy``); each process reopens the repository at its first use.

Guarding: ``callbacks=[DeltackptGuard("ckpt", Guard(), every_n_steps=50)]`` saves the module,
optimizer, scheduler, GradScaler and RNG as a training state every 50 steps (through a
:class:`~deltackpt.Checkpointer`) and judges each batch's loss (and the values given in
``watch``, read from ``trainer.callback_metrics``).  When the guard fires, they roll back in place
to the newest sound version; Lightning's step counter and dataloader go on (the batches since
that version are skipped), and the rollback is logged as one line through Lightning's logger
(``pytorch_lightning.callbacks.deltackpt``) besides deltackpt's own.  Under DDP every rank judges
its own loss and they roll back together (:class:`~deltackpt.training.Guard`); global rank 0
saves.

Example::

    trainer = pl.Trainer(plugins=[DeltackptIO("ckpt")],
                         callbacks=[ModelCheckpoint(dirpath="ckpts", every_n_train_steps=50), DeltackptMetrics()])
    trainer.fit(model)
    trainer.fit(model, ckpt_path="ckpts/last.ckpt")      # resumes from the repository
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from typing import TYPE_CHECKING, Any, Optional, cast

import torch

from ..api import Repo, internal, load, portable_location, save
from ..training import Checkpointer, Guard, training_state
from ..deps import require
from ..errors import (CheckpointNotFoundError, CorruptObjectError, DeltackptError, ForeignFileError,
                      UnknownVersionError)
from .plain import from_plain, to_plain

__all__ = ["DeltackptGuard", "DeltackptIO", "DeltackptMetrics", "to_plain", "from_plain"]

if TYPE_CHECKING:   # the classes themselves (require() returns a module, typed as any module)
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
    from pytorch_lightning import Callback

    from ..api.internal import SaveHandle
else:
    CheckpointIO = require("lightning_fabric.plugins.io.checkpoint_io",
                           feature="deltackpt's Lightning plugin").CheckpointIO
    Callback = require("pytorch_lightning", feature="deltackpt's Lightning guard").Callback
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO  # noqa: E402  (installed with CheckpointIO)
from lightning_fabric.utilities.cloud_io import get_filesystem  # noqa: E402

from .lightning_metrics import METRICS_KEY, DeltackptMetrics, monitored_score, plain_metrics  # noqa: E402

log = logging.getLogger("pytorch_lightning.callbacks.deltackpt")   # under Lightning's own handler

POINTER_MAGIC = "deltackpt"
HAND_BACK = ".temp.ckpt"
"""The name Lightning's ddp_spawn and XLA launchers give the file rank 0's weights travel through
(``strategies/launchers/multiprocessing.py``): a transfer, not a checkpoint of the run."""


def _tag_for(path: str) -> str:
    stem = os.path.basename(path)
    stem = re.sub(r"\.ckpt$", "", stem)
    return "ckpt-" + re.sub(r"[^A-Za-z0-9_-]+", "_", stem)[:100]


def _read_pointer(head: bytes) -> "tuple[str, str] | None":
    """(repository location, version id) of a pointer file's first bytes; None if it is not one.
    The location may hold spaces: it is everything between the magic word and the id."""
    text = head.decode("utf-8", "replace").strip()
    if not text.startswith(POINTER_MAGIC + " "):
        return None
    rest = text[len(POINTER_MAGIC) + 1:]
    location, _, vid = rest.rpartition(" ")
    if not location or not re.fullmatch(r"[0-9a-f]{16,128}", vid):
        return None
    return location, vid


def _is_local(fs: Any) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))


def _remove_hand_back(path: str) -> None:
    """Delete the hand-back file, and the temp folder the spawn launcher made for it alone
    (``tempfile.mkdtemp()``; Lightning leaves it behind); any other folder stays."""
    fs = get_filesystem(path)
    if fs.isfile(path):
        fs.rm(path)
    folder = os.path.dirname(os.path.abspath(path))
    if _is_local(fs) and os.path.dirname(folder) == os.path.abspath(tempfile.gettempdir()):
        try:
            os.rmdir(folder)   # only when empty
        except OSError:
            pass


class DeltackptIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that writes checkpoints into a deltackpt repository.

    ``blocking=False`` saves in the background (the trainer waits only for the snapshot;
    ``teardown`` waits for the last save).  ``encoding`` opts tensors into lossy modes as in
    :func:`deltackpt.save`.
    """

    def __init__(self, repo: "str | os.PathLike | Repo", *, blocking: bool = True, encoding: Any = None) -> None:
        opened = repo if isinstance(repo, Repo) else Repo(repo, create=True)
        self._location = portable_location(opened)
        self._repo: Repo | None = opened
        self._owns_repo = opened is not repo   # opened here from a path: teardown closes it
        self.blocking = blocking
        self.encoding = encoding
        self._pending: list = []

    @property
    def repo(self) -> Repo:
        """The repository, opened in this process at first use."""
        if self._repo is None:
            self._repo, self._owns_repo = Repo(self._location, create=True), True
        return self._repo

    def __getstate__(self) -> dict[str, Any]:
        # only the location and options travel: the open repository (locks, caches) stays here
        return {"location": self._location, "blocking": self.blocking, "encoding": self.encoding}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._location, self.blocking, self.encoding = state["location"], state["blocking"], state["encoding"]
        self._repo, self._pending, self._owns_repo = None, [], False

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = os.fspath(path)
        if os.path.basename(path) == HAND_BACK:
            TorchCheckpointIO().save_checkpoint(checkpoint, path)   # read back once by the main process, then removed
            return
        fs = get_filesystem(path)
        metrics = {**monitored_score(checkpoint, path, _is_local(fs)), **plain_metrics(checkpoint.get(METRICS_KEY))}
        converted: dict[str, str] = {}
        state = to_plain({k: v for k, v in checkpoint.items() if k != METRICS_KEY}, "", converted)
        step = checkpoint.get("global_step")
        where = os.path.abspath(path) if _is_local(fs) else path
        meta = {"lightning_path": where, "converted": converted, "epoch": checkpoint.get("epoch")}
        result = save(state, self.repo, step=int(step) if isinstance(step, int) else None, metrics=metrics, meta=meta,
                      encoding=self.encoding, blocking=self.blocking)
        if self.blocking:
            self._finish(result, path, where)
            return
        self._pending.append(result)
        # the pointer names the version id, known only once committed: write it from the save
        # thread right after the save (the trainer does not wait for either)
        internal.run_after(self.repo, lambda: self._finish(cast("SaveHandle", result).wait(), path, where))


    def _tag_name(self, path: str, where: str) -> str:
        """``ckpt-<file name>``, unless a file of that name in another folder holds it: then
        ``ckpt-<file name>-<hash of this path>`` (two ModelCheckpoints both writing last.ckpt into
        one repository must not take each other's tag, or gc would drop a version a file names)."""
        base = _tag_for(path)
        held = self.repo.tags().get(base)
        if held is not None:
            try:
                owner = self.repo.resolve(held).meta
            except DeltackptError:
                owner = None
            owner = owner.get("lightning_path") if isinstance(owner, dict) else None
            if owner is not None and owner != where:
                return f"{base}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"
        return base

    def _untag_file(self, path: str) -> None:
        """The pointer file at ``path`` is being replaced or removed: its version loses the tags
        named after the file (the version stays until gc)."""
        pointed = self._pointer_at(path)
        if pointed is None:
            return
        base = _tag_for(path)
        for name, vid in self.repo.tags().items():
            if vid == pointed[1] and (name == base or name.startswith(base + "-")):
                self.repo.untag(name)

    def _finish(self, version: Any, path: str, where: str) -> None:
        self._untag_file(path)
        self.repo.tag(self._tag_name(path, where), version.id, force=True)
        text = f"{POINTER_MAGIC} {self.repo.location} {version.id}\n".encode()
        fs = get_filesystem(path)
        if not _is_local(fs):
            # one object PUT: visible whole or not at all on object stores (which have no folders to make)
            fs.pipe_file(path, text)
            return
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _pointer_at(self, path: str) -> "tuple[str, str] | None":
        """(location, version id) of the pointer file at ``path``; None if there is no file or it
        is not a pointer."""
        fs = get_filesystem(path)
        if not fs.isfile(path):
            return None
        with fs.open(path, "rb") as f:
            return _read_pointer(f.read(4096))

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        self.teardown()
        path = os.fspath(path)
        if os.path.basename(path) == HAND_BACK:
            return TorchCheckpointIO().load_checkpoint(path, map_location=map_location, weights_only=True)
        fs = get_filesystem(path)
        if fs.isfile(path):
            pointed = self._pointer_at(path)
            if pointed is None:
                return self._load_torch_file(path, map_location)
            try:
                vid = self.repo.resolve(pointed[1]).id
            except UnknownVersionError:
                raise CheckpointNotFoundError(f"Checkpoint file {path} names version {pointed[1][:10]}, which "
                                              f"{self.repo.location} does not hold (removed by gc, or saved into "
                                              f"{pointed[0]})") from None
        else:
            try:
                vid = self.repo.resolve(path).id
            except UnknownVersionError:
                # Lightning's own wording first (its tests and users match on it), then ours
                raise CheckpointNotFoundError(f"Checkpoint file not found: {path} (no deltackpt pointer file there, "
                                              f"and not a revision of {self.repo.location})") from None
        location = map_location if isinstance(map_location, (str, torch.device)) else "cpu"
        try:
            return from_plain(load(self.repo, vid, map_location=location))
        except CorruptObjectError as exc:   # a malformed tagged value names its entry; say which version
            raise CorruptObjectError(f"{self.repo.location}, version {vid[:10]}: {exc}") from None

    @staticmethod
    def _load_torch_file(path: str, map_location: Any) -> dict[str, Any]:
        """A checkpoint Lightning wrote with torch.save (before the switch to deltackpt), read as
        Lightning reads it but always with torch's weights-only loader: nothing in it runs."""
        import pickle
        try:
            return TorchCheckpointIO().load_checkpoint(path, map_location=map_location, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
            first = " ".join(str(exc).split())[:200]
            raise ForeignFileError(f"{path} is neither a deltackpt pointer file nor a checkpoint torch's weights-only "
                                   f"loader reads ({type(exc).__name__}: {first})") from None

    def remove_checkpoint(self, path: Any) -> None:
        path = os.fspath(path)
        self.teardown()
        if os.path.basename(path) == HAND_BACK:
            _remove_hand_back(path)
            return
        self._untag_file(path)
        fs = get_filesystem(path)
        if fs.isfile(path):
            fs.rm(path)

    def teardown(self) -> None:
        """Wait for background saves (and their pointer files), then close the repository handle
        this plugin opened: no thread of ours outlives the run (Lightning checks), and the next
        use opens it again."""
        if self._repo is None:
            return  # never opened in this process: nothing of ours can be pending
        repo = self._repo
        try:
            repo.wait()
            pending, self._pending = self._pending, []
            for h in pending:
                h.wait()
        finally:
            if self._owns_repo:
                self._repo, self._owns_repo = None, False
                repo.close()


class DeltackptGuard(Callback):
    """A Lightning callback that checkpoints a training state every ``every_n_steps`` optimizer
    steps and lets ``guard`` roll the run back when the loss diverges (see the module docstring).

    The guard gets the module, the first optimizer and scheduler, and the precision plugin's
    GradScaler at the start of training; its ``data`` must be ``"skip"`` (Lightning's dataloader
    goes on).  ``blocking=False`` saves in the background.  ``drill_every``: a rollback drill every
    that many saves (:class:`~deltackpt.Checkpointer`).  Under DDP give every rank its callback
    and guard (the trainer does, when they are built in the training script); global rank 0 saves,
    and all roll back together.

    Example::

        trainer = pl.Trainer(max_steps=1000, callbacks=[DeltackptGuard("ckpt", Guard(lr_scale=0.5))])
        trainer.fit(model, loader)
        print([e.kind for e in deltackpt.Repo("ckpt").events()])
    """

    def __init__(self, repo: "str | os.PathLike | Repo", guard: Guard, *, every_n_steps: int = 50,
                 blocking: bool = True, drill_every: int | None = None) -> None:
        if guard.data != "skip":
            raise DeltackptError("Lightning's dataloader goes on after a rollback: the guard's data must be 'skip'")
        self.repo = repo if isinstance(repo, Repo) else Repo(repo, create=True)
        self._owns_repo = self.repo is not repo   # opened here from a path: teardown closes it
        self.guard, self.every_n_steps, self.blocking, self.drill_every = guard, every_n_steps, blocking, drill_every
        self.checkpointer: Checkpointer | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.repo.closed:   # a second fit after teardown closed the handle this callback opened
            self.repo = Repo(self.repo, create=True)
        parts = self.guard.parts
        parts.model = pl_module
        parts.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        configs = getattr(trainer, "lr_scheduler_configs", None) or []
        parts.scheduler = configs[0].scheduler if configs else None
        parts.scaler = getattr(trainer.precision_plugin, "scaler", None)
        start = int(trainer.global_step) or None
        self.checkpointer = Checkpointer(self.repo, self.every_n_steps, blocking=self.blocking, guard=self.guard,
                                         start_step=start, drill_every=self.drill_every,
                                         writes=bool(trainer.is_global_zero))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.checkpointer is not None
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k in self.guard.rules}
        if loss is not None:
            metrics["loss"] = loss
        step, p = int(trainer.global_step), self.guard.parts
        self.checkpointer.step(lambda: training_state(model=pl_module, optimizer=p.optimizer, scheduler=p.scheduler,
                                                      scaler=p.scaler, step=step), step=step, metrics=metrics)
        rb = self.checkpointer.rollback
        if rb is not None and trainer.is_global_zero:
            log.warning(rb.message)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        try:
            if self.checkpointer is not None:
                self.checkpointer.close()
                self.checkpointer = None
            self.repo.wait()
        finally:
            if self._owns_repo:
                self.repo.close()   # Lightning checks that no thread outlives the run
