"""PyTorch Lightning: store every checkpoint Lightning writes in a deltackpt repository.

``Trainer(plugins=[DeltackptIO("ckpt")])`` routes each ``ModelCheckpoint`` save through
:meth:`DeltackptIO.save_checkpoint`: the checkpoint dict becomes a new version (deltas against
the previous one, unchanged chunks not written), and a small pointer file is written at the path
Lightning asked for (``deltackpt <repo> <version id>``), so Lightning's own file logic (top-k
bookkeeping, ``ckpt_path="last"``, ``best_model_path``) keeps working.  ``trainer.fit(model,
ckpt_path=path)`` loads the version the pointer names; ``ckpt_path`` may also be a revision of
the repository itself (``"latest"``, a tag, ``"best:val_loss"``, an id prefix).
``remove_checkpoint`` deletes the pointer and the version's tag; ``deltackpt gc`` reclaims it.

What a Lightning checkpoint holds besides tensors, and what happens to it: dicts (also
``AttributeDict``/``OrderedDict``), lists, tuples, numbers, strings, bytes and None are stored
as they are (mappings come back as plain dicts); numpy arrays become tensors, numpy scalars
Python numbers, ``pathlib`` paths, ``torch.dtype`` and ``torch.device`` strings, enums their
value.  Every such conversion is listed in the version's meta (``converted``).  Anything else
(an arbitrary object in ``hyper_parameters``, say) raises :class:`~deltackpt.UnsupportedLeafError`
naming its key: nothing is dropped or pickled silently.

Example::

    trainer = pl.Trainer(plugins=[DeltackptIO("ckpt")],
                         callbacks=[ModelCheckpoint(dirpath="ckpts", every_n_train_steps=50)])
    trainer.fit(model)
    trainer.fit(model, ckpt_path="ckpts/last.ckpt")      # resumes from the repository
"""

from __future__ import annotations

import enum
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import torch

from ...deps import require
from ...errors import DeltackptError, UnknownVersionError, UnsupportedLeafError
from ..api import Repo, load, save

CheckpointIO = require("lightning_fabric.plugins.io.checkpoint_io",
                       feature="deltackpt's Lightning plugin").CheckpointIO

POINTER_MAGIC = "deltackpt"


def to_plain(obj: Any, path: str = "", converted: dict[str, str] | None = None) -> Any:
    """A copy of ``obj`` deltackpt can store without pickle; conversions are noted in ``converted``."""
    where = path or "<root>"
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, Mapping):
        if converted is not None and type(obj) is not dict:
            converted[where] = f"{type(obj).__name__}->dict"
        return {k: to_plain(v, f"{path}.{k}" if path else str(k), converted) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple, torch.Size):
        out = [to_plain(v, f"{path}.{i}" if path else str(i), converted) for i, v in enumerate(obj)]
        return out if type(obj) is list else tuple(out)
    note = None
    value: Any = None
    if isinstance(obj, np.ndarray):
        value, note = torch.from_numpy(np.ascontiguousarray(obj)), "ndarray->tensor"
    elif isinstance(obj, np.generic):
        value, note = obj.item(), f"{type(obj).__name__}->{type(obj.item()).__name__}"
    elif isinstance(obj, pathlib.PurePath):
        value, note = str(obj), "path->str"
    elif isinstance(obj, (torch.dtype, torch.device)):
        value, note = str(obj), f"{type(obj).__name__}->str"
    elif isinstance(obj, enum.Enum):
        value, note = to_plain(obj.value, path, converted), f"{type(obj).__name__}->value"
    elif isinstance(obj, (list, tuple)):   # namedtuples and list subclasses
        value, note = to_plain(list(obj) if isinstance(obj, list) else tuple(obj), path, converted), \
            f"{type(obj).__name__}->{'list' if isinstance(obj, list) else 'tuple'}"
    else:
        raise UnsupportedLeafError(
            f"Lightning checkpoint entry {where}: {type(obj).__module__}.{type(obj).__qualname__} cannot be stored "
            "without pickle; make it a plain value (e.g. save_hyperparameters(ignore=[...]) or a str)")
    if converted is not None:
        converted[where] = note
    return value


def _tag_for(path: str) -> str:
    stem = os.path.basename(path)
    stem = re.sub(r"\.ckpt$", "", stem)
    return "ckpt-" + re.sub(r"[^A-Za-z0-9_-]+", "_", stem)[:100]


class DeltackptIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that writes checkpoints into a deltackpt repository.

    ``blocking=False`` saves in the background (the trainer waits only for the snapshot;
    ``teardown`` waits for the last save).  ``encoding`` opts tensors into lossy modes as in
    :func:`deltackpt.save`.
    """

    def __init__(self, repo: "str | os.PathLike | Repo", *, blocking: bool = True, encoding: Any = None) -> None:
        self.repo = repo if isinstance(repo, Repo) else Repo(repo, create=True)
        self.blocking = blocking
        self.encoding = encoding
        self._pending: list = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = os.fspath(path)
        converted: dict[str, str] = {}
        state = to_plain(checkpoint, "", converted)
        step = checkpoint.get("global_step")
        meta = {"lightning_path": os.path.abspath(path), "converted": converted,
                "epoch": checkpoint.get("epoch")}
        result = save(state, self.repo, step=int(step) if isinstance(step, int) else None, meta=meta,
                      encoding=self.encoding, blocking=self.blocking)
        if self.blocking:
            self._finish(result, path)
            return
        self._pending.append(result)
        # the pointer names the version id, known only once committed: write it from the save
        # thread right after the save (the trainer does not wait for either)
        from .. import async_save
        async_save.run_after(self.repo.core, lambda: self._finish(result.wait(), path))

    def _finish(self, version: Any, path: str) -> None:
        self.repo.tag(_tag_for(path), version.id, force=True)
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{POINTER_MAGIC} {self.repo.location} {version.id}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _resolve(self, path: str) -> str:
        if os.path.isfile(path):
            with open(path, "rb") as f:
                head = f.read(4096)
            parts = head.decode("utf-8", "replace").split()
            if len(parts) == 3 and parts[0] == POINTER_MAGIC:
                return parts[2]
            raise DeltackptError(f"{path} is not a deltackpt pointer file (a torch.save checkpoint? load it with "
                                 "Lightning's default CheckpointIO)")
        try:
            return self.repo.core.resolve(path)
        except UnknownVersionError:
            raise UnknownVersionError(f"{path}: no such pointer file, and not a revision of {self.repo.location}") from None

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        self.teardown()
        vid = self._resolve(os.fspath(path))
        location = map_location if isinstance(map_location, (str, torch.device)) else "cpu"
        return load(self.repo, vid, map_location=location)

    def remove_checkpoint(self, path: Any) -> None:
        path = os.fspath(path)
        self.teardown()
        tag = _tag_for(path)
        if tag in self.repo.tags():
            self.repo.untag(tag)
        if os.path.isfile(path):
            os.remove(path)

    def teardown(self) -> None:
        """Wait for background saves (and their pointer files)."""
        from .. import async_save
        async_save.drain(self.repo.core)
        pending, self._pending = self._pending, []
        for h in pending:
            h.wait()
