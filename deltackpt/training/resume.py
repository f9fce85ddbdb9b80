"""Getting back to where a killed job was: :func:`resume` takes the newest version that loads
and verifies, reads only what differs from what the model and optimizer hold, and applies it
all or nothing.

Example::

    info = deltackpt.resume("ckpt", model=model, optimizer=opt, scheduler=sched)
    start = info.step if info else 0
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ..api import Repo, internal
from ..api.internal import Version
from ..errors import DeltackptError, NotARepositoryError, UnknownVersionError
from ..gcpause import collector_paused
from . import rng
from .parts import check_parts

if TYPE_CHECKING:
    from ..api.types import Revision, Stateful


@dataclass
class ResumeInfo:
    """What :func:`resume` restored: the version, its step, metrics, meta and ``extra``."""

    version: Version
    step: int | None
    metrics: dict[str, Any] = field(default_factory=dict)
    meta: Any = None
    extra: Any = None
    skipped: list[str] = field(default_factory=list)   # newer versions that failed to load


def _candidates(r: Repo, version: "str | Version") -> Iterator[str]:
    """The versions to try, in order.  For ``latest``: newest first, including a version whose ref
    never moved, and one whose manifest is damaged (its load fails typed, so it is skipped with a
    warning naming it); never one committed off the training line (an import: weights, not a
    training state).  Lazily: only the heads order them, and a version's manifest is decoded (to
    see whether it is off the line; the load that follows reads it from the handle's cache) when
    it comes to be tried, so a restart after a long history decodes one or two manifests, not all
    of them."""
    if not (isinstance(version, str) and version in ("latest", "HEAD")):
        return iter([internal.resolve_id(r, version)])
    history = [vid for vid, _err in internal.newest_first(r)]
    latest = internal.latest_id(r)
    if latest in history:       # the ref names the newest committed one: try it first
        history.remove(latest)
        history.insert(0, latest)
    return (vid for vid in history if not _off_line(r, vid))


def _off_line(r: Repo, vid: str) -> bool:
    try:
        extra = internal.manifest(r, vid).extra
    except DeltackptError:
        return False    # damaged: tried, and skipped with a warning when its load fails
    return extra.get("off_line") is True


def resume(repo: "str | os.PathLike[str] | Repo", *, model: "torch.nn.Module | None" = None,
           optimizer: "Stateful | None" = None, scheduler: "Stateful | None" = None, scaler: "Stateful | None" = None,
           sampler: "Stateful | None" = None, restore_rng: bool = True, version: "Revision" = "latest",
           strict: bool = True) -> ResumeInfo | None:
    """Restore a training state saved with :func:`~deltackpt.training.training_state` (or the same
    keys) into the given parts.


    ``version="latest"`` tries versions newest first and takes the first that loads and verifies
    (every chunk is hash-checked while loading); a corrupt or incomplete one is skipped with a
    warning.  Nothing is applied to the model or optimizer until the whole version has loaded.  What
    they hold now is used while loading: a chunk they already hold, or that a few stored deltas turn
    into the target, is not read again (a rollback within a run reads what differs).

    Args:
        repo: the repository: a path or URL, or a :class:`~deltackpt.Repo`.
        model: the module to restore into (the version's ``model`` entry).
        optimizer: its optimizer (the ``optimizer`` entry).
        scheduler: a learning-rate scheduler (the ``scheduler`` entry).
        scaler: a ``GradScaler`` (the ``scaler`` entry).
        sampler: a :class:`~deltackpt.training.ResumableSampler` (the ``sampler`` entry).
        restore_rng: restore the Python, numpy and torch RNG states saved with the version.
        version: ``"latest"`` (the newest that loads), or any revision (``"best:val_loss"``, a tag,
            ``"latest~3"``), which is restored or raises.
        strict: refuse a version whose model tensors and the model's differ.

    Returns:
        A ``ResumeInfo`` (the ``version``, its ``step``, ``metrics``, ``meta`` and ``extra``), or
        None when the repository does not exist or holds no version (a fresh start).

    Raises:
        UnknownVersionError: a named version that does not exist.
        StateMismatchError: the parts given do not match the version (nothing was applied).
        DeltackptError: with ``"latest"``, every version fails to load (the newest one's error, of
        its type: CorruptObjectError for a damaged chunk).

    Example:
        ```python
        info = deltackpt.resume("ckpt", model=model, optimizer=opt, scheduler=sched)
        start = info.step if info else 0
        deltackpt.resume("ckpt", model=model, version="best:val_loss")   # roll back
        ```
    """
    try:
        r = repo if isinstance(repo, Repo) else Repo(repo)
    except NotARepositoryError:
        return None
    try:
        return _resume(r, model, optimizer, scheduler, scaler, sampler, restore_rng, version, strict)
    finally:
        if r is not repo:
            r.close()


def _resume(r: Repo, model: Any, optimizer: Any, scheduler: Any, scaler: Any, sampler: Any, restore_rng: bool,
            version: "str | Version", strict: bool) -> ResumeInfo | None:
    r.wait()   # a background save of this handle still in flight commits first
    try:
        candidates = _candidates(r, version)
    except UnknownVersionError:
        if version == "latest":
            return None
        raise
    skipped: list[str] = []
    last_error: DeltackptError | None = None
    for vid in candidates:
        try:
            with collector_paused():   # the manifest's and the plan's objects die with the call
                state, v = _load_near(r, vid, model, optimizer)
        except DeltackptError as exc:
            if not (isinstance(version, str) and version in ("latest", "HEAD")):
                raise
            warnings.warn(f"deltackpt.resume: version {vid[:10]} does not load ({exc}); trying an older one",
                          RuntimeWarning, stacklevel=2)
            skipped.append(vid)
            last_error = exc
            continue
        _apply(state, v, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, sampler=sampler,
               restore_rng=restore_rng, strict=strict)
        step = state.get("step", v.step) if isinstance(state, dict) else v.step
        return ResumeInfo(v, step, dict(v.metrics), v.meta, state.get("extra") if isinstance(state, dict) else None,
                          skipped)
    if last_error is None:
        return None
    raise type(last_error)(f"{r.location}: no version loads; the newest failed with: {last_error}")


def _load_near(r: Any, vid: str, model: Any, optimizer: Any) -> tuple[Any, Version]:
    """``load(r, vid)``, reading only what differs from what ``model`` and ``optimizer`` hold now
    (a rollback within a run): their tensors seed fresh buffers, so nothing live is written until
    the whole version has loaded.  A fresh model matches nothing and reads everything."""
    from ..torchstate.flatten import unflatten
    from ..torchstate.materialize import build_tensors, is_own_blob
    from ..torchstate.tensor_bytes import writable_bytes

    live: dict[str, Any] = {}
    if model is not None:
        live.update((f"model.{k}", t) for k, t in model.state_dict().items())
    if optimizer is not None and hasattr(optimizer, "state_dict"):
        for i, s in optimizer.state_dict().get("state", {}).items():
            live.update((f"optimizer.state.{i}.{k}", t) for k, t in s.items() if isinstance(t, torch.Tensor))
    m = internal.manifest(r, vid)
    seeds = {}
    for e in m.tensors:
        t = live.get(e.name)
        if (isinstance(t, torch.Tensor) and is_own_blob(m, e) and list(t.shape) == e.shape
                and str(t.dtype).removeprefix("torch.") == e.dtype):
            src = writable_bytes(t)
            if src is not None:
                seeds[e.blob] = src
    chosen = list(range(len(m.tensors)))
    buffers = internal.read_blobs(r, vid, m, (e.blob for e in m.tensors), seeds=seeds)
    tensors = build_tensors(m, chosen, buffers, "cpu")
    return unflatten(m.tree, tensors.__getitem__), internal.version_of(r, vid, m)


def _apply(state: Any, v: Version, **parts: Any) -> None:
    strict = parts.pop("strict")
    restore_rng = parts.pop("restore_rng")
    # every part against the version before the first write: all or nothing
    check_parts(state, f"version {v.short_id}", parts, strict=strict, rng_too=restore_rng)
    # a lazy save (to any repository) may still be copying the live tensors this writes into
    internal.wait_snapshots()
    for name, target in parts.items():
        if target is None:
            continue
        if name == "model":
            target.load_state_dict(state[name], strict=strict)
        else:
            target.load_state_dict(state[name])
    if restore_rng and "rng" in state:
        rng.restore(state["rng"])
