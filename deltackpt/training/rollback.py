"""Rolling a live training state back to a version, in place, reading only what differs.

:func:`roll_back` opens the repository afresh over a byte-counting view of its store (so the
bytes a rollback reads are measured, not guessed) and restores through the live-rollback path of
:func:`deltackpt.restore`: each chunk of the model's and optimizer's own tensors is hashed where it
lies; one they already hold is neither read nor written, one a few stored deltas away is stepped
there in place, the rest is read.  No second copy of the state is made.  The small parts
(scheduler, GradScaler, sampler, RNG, step, ``extra``) are then loaded and applied, and the data
position and learning rate set as the guard was asked.

A model or optimizer that does not match the version is refused before anything is written.  A
damaged chunk met half way leaves that tensor partly overwritten (in place means no spare copy):
the guard then restores an older version over it, which reads whatever the damage left behind.

Example::

    done = roll_back(repo, vid, Parts(model=model, optimizer=opt, sampler=sampler), data="skip")
    print(done.bytes_read, done.seconds, done.skipped)
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..api import Repo, internal, load, restore
from ..api.internal import Version
from ..errors import InvalidArgumentError, StateMismatchError
from . import rng

if TYPE_CHECKING:
    import torch

    from ..api.handles import Handle
    from ..api.types import Stateful

DATA_MODES = ("skip", "reseed", "replay")


@dataclass
class Parts:
    """The live objects a rollback restores (any may be None)."""

    model: "torch.nn.Module | None" = None
    optimizer: "Stateful | None" = None
    scheduler: "Stateful | None" = None
    scaler: "Stateful | None" = None
    sampler: "Stateful | None" = None
    restore_rng: bool = True

    def check(self, data: str) -> None:
        if data not in DATA_MODES:
            raise InvalidArgumentError(f"data must be one of {DATA_MODES}, got {data!r:.60}")
        if self.sampler is None:
            if data != "skip":   # the loop's own data goes on: skipping is all a guard can do then
                raise InvalidArgumentError(f"data={data!r} needs sampler= (a ResumableSampler): without one the "
                                           "loop's data simply goes on, which is data='skip'")
            return
        for method in ("state_dict", "load_state_dict"):
            if self.sampler is not None and not callable(getattr(self.sampler, method, None)):
                raise InvalidArgumentError(f"sampler has no {method}(): give a ResumableSampler")
        if data == "reseed" and not callable(getattr(self.sampler, "reshuffle", None)):
            raise InvalidArgumentError("data='reseed' needs a sampler with reshuffle(seed) (ResumableSampler)")


@dataclass
class Restored:
    """A finished rollback: the version, the step its state is at, its ``extra``, the chunk
    bytes read (packs) and everything else read (config, index, manifest), the seconds the load
    took, and the sampler window skipped (``[[epoch, index], [epoch, index]]`` or None)."""

    version: Version
    step: int | None
    extra: Any
    bytes_read: int
    metadata_bytes: int
    seconds: float
    skipped: list[list[int]] | None = None


def roll_back(repo: Repo, vid: str, parts: Parts, *, data: str = "skip", lr_scale: float | None = None,
              seed: int = 0, skip_ahead: int = 0) -> Restored:
    """Restore version ``vid`` into ``parts`` (all or nothing), then move the data on (``skip``:
    past everything consumed since that version, and ``skip_ahead`` items further within the
    epoch; ``reseed``: the rest of the epoch reshuffled with ``seed``; ``replay``: as it was)
    and scale the learning rate by ``lr_scale``."""
    before = parts.sampler.state_dict() if parts.sampler is not None else None
    t0 = time.perf_counter()
    handle, meter = internal.metered(repo)   # a fresh handle: what it reads is what this rollback costs
    try:
        version, rest = _restore_parts(handle, vid, parts)
    finally:
        handle.close()
    seconds = time.perf_counter() - t0
    packs = meter.bytes_read_under("packs/")
    step = rest.get("step", version.step)
    done = Restored(version, step if isinstance(step, int) else version.step, rest.get("extra"), packs,
                    meter.bytes_read - packs, seconds)
    if parts.sampler is not None:
        done.skipped = _move_data(parts.sampler, before, data, seed, skip_ahead)
    if lr_scale is not None:
        scale_lr(parts.optimizer, parts.scheduler, lr_scale)
    return done


SMALL_PARTS = ("scheduler", "scaler", "sampler", "rng", "step", "extra")


def _restore_parts(handle: Handle, vid: str, parts: Parts) -> tuple[Version, dict[str, Any]]:
    """Model and optimizer in place, then the small parts; returns the Version and the version's
    tree without the model's and optimizer's tensors."""
    tree = internal.manifest(handle, vid).tree
    wanted = {"model": parts.model, "optimizer": parts.optimizer, "scheduler": parts.scheduler,
              "scaler": parts.scaler, "sampler": parts.sampler}
    missing = [k for k, v in wanted.items() if v is not None and not (isinstance(tree, dict) and k in tree)]
    if missing:   # refused before anything is written
        raise StateMismatchError(f"version {vid[:10]} holds no {', '.join(map(repr, missing))} entry to restore")
    if parts.model is not None:
        version = restore(parts.model, handle, vid, optimizer=parts.optimizer)
    else:
        version = internal.version_of(handle, vid)
    # the small parts holding tensors (a GradScaler's scale, RNG states) are loaded as layers; a part
    # without any (a scheduler, the step) is plain values, copied from the tree (naming it as a
    # layer would be refused as selecting nothing)
    names = [t.name for t in internal.manifest(handle, vid).tensors]
    present = [p for p in SMALL_PARTS if isinstance(tree, dict) and p in tree]
    loaded = [p for p in present if any(n == p or n.startswith(p + ".") for n in names)]
    rest = load(handle, vid, layers=loaded) if loaded else {}
    rest.update({p: copy.deepcopy(tree[p]) for p in present if p not in loaded})
    for name in ("scheduler", "scaler", "sampler"):
        part = wanted[name]
        if part is not None:
            part.load_state_dict(rest[name])
    if parts.restore_rng and "rng" in rest:
        rng.restore(rest["rng"])
    return version, rest


def _move_data(sampler: Any, before: Any, data: str, seed: int, skip_ahead: int) -> list[list[int]] | None:
    """Apply ``data`` to the restored sampler; the window skipped, when the sampler says where it is."""
    if data == "reseed":
        sampler.reshuffle(seed)
        return None
    if data == "replay":
        return None
    restored = sampler.state_dict()
    if skip_ahead and isinstance(before.get("consumed"), int) and isinstance(before.get("n"), int):
        before = {**before, "consumed": min(before["n"], before["consumed"] + skip_ahead)}
    sampler.load_state_dict(before)
    try:
        return [[int(restored["epoch"]), int(restored["consumed"])], [int(before["epoch"]), int(before["consumed"])]]
    except (KeyError, TypeError, ValueError):
        return None   # a sampler of another kind: skipped, but it does not say where it was


def scale_lr(optimizer: Any, scheduler: Any, factor: float) -> None:
    """Multiply every parameter group's learning rate by ``factor``, and the scheduler's base
    rates (``base_lrs``, ``initial_lr``) with it: schedulers recompute the rate from those at
    their next step, which would undo a change to ``lr`` alone."""
    for opt in _optimizers(optimizer):
        for group in opt.param_groups:
            for key in ("lr", "initial_lr"):
                if isinstance(group.get(key), (int, float)):
                    group[key] = group[key] * factor
    base = getattr(scheduler, "base_lrs", None)
    if isinstance(base, list):
        scheduler.base_lrs = [b * factor for b in base]


def _optimizers(optimizer: Any) -> list[Any]:
    """torch optimizers inside ``optimizer``: itself, or those of a wrapper holding several
    (``.opts`` as in bench/workloads.py, ``.optimizers``, ``.optimizer``)."""
    if optimizer is None:
        return []
    if hasattr(optimizer, "param_groups"):
        return [optimizer]
    for attr in ("opts", "optimizers", "optimizer"):
        inner = getattr(optimizer, attr, None)
        if isinstance(inner, dict):
            return [o for v in inner.values() for o in _optimizers(v)]
        if isinstance(inner, (list, tuple)):
            return [o for v in inner for o in _optimizers(v)]
        if inner is not None:
            return _optimizers(inner)
    return []
