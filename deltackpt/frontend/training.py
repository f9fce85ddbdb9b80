"""A training loop's side of deltackpt: when to save (Checkpointer), what a resumable state holds
(training_state, ResumableSampler), and getting back to where a killed job was (resume).

Example::

    from deltackpt import Checkpointer, Retention, resume
    from deltackpt.frontend.policies import EveryN, OnImprovement
    from deltackpt.frontend.training import ResumableSampler, training_state

    sampler = ResumableSampler(len(dataset), seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, generator=torch.Generator())
    info = resume("ckpt", model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    step = info.step if info else 0
    ckpt = Checkpointer("ckpt", policy=[EveryN(200), OnImprovement("val_loss")],
                        retention=Retention(keep_last=3, keep_best=("val_loss", 1, "min")))
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...; step += 1
            ckpt.step(lambda: training_state(model=model, optimizer=opt, scheduler=sched,
                                             sampler=sampler, step=step), step=step, metrics={"loss": loss})
    ckpt.close()
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

from ..errors import DeltackptError, InvalidArgumentError, NotARepositoryError, StateMismatchError, UnknownVersionError
from ..repo.gc import DEFAULT_GRACE_SECONDS, run_gc
from ..repo.retention import Retention, check_seconds
from ..repo.versions import Version
from . import async_save, rng
from .api import Repo, _repo
from .async_save import SaveHandle
from .policies import Policy, as_policy


class ResumableSampler(torch.utils.data.Sampler[int]):
    """A shuffling sampler whose position can be saved and restored.

    Each epoch is a permutation from ``torch.Generator().manual_seed(seed + epoch)`` (the global
    RNG is not touched).  ``state_dict()`` records the epoch and how many indices were handed
    out; after ``load_state_dict`` the next iteration continues from there.  With
    ``num_workers > 0`` the DataLoader prefetches ahead of training, so pass the count the loop
    actually consumed: ``sampler.state_dict(consumed=batches_done * batch_size)``.  Give the
    DataLoader its own ``generator``: otherwise every new iterator draws a seed from the global
    torch RNG, and the resumed run (which starts one more iterator) drifts from the original.

    Example::

        sampler = ResumableSampler(len(ds), seed=0)
        loader = DataLoader(ds, batch_size=16, sampler=sampler, generator=torch.Generator())
        for epoch in range(sampler.epoch, 10):
            sampler.set_epoch(epoch)
            for batch in loader: ...
    """

    def __init__(self, n: int, *, seed: int = 0, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle = int(n), int(seed), shuffle
        self.epoch = 0
        self.consumed = 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (a no-op when it is the current one, so a resumed position is kept)."""
        if epoch != self.epoch:
            self.epoch, self.consumed = int(epoch), 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        while self.consumed < self.n:
            i = order[self.consumed]
            self.consumed += 1
            yield i
        # the epoch is over: the next iteration starts the next one unless set_epoch says otherwise
        self.epoch, self.consumed = self.epoch + 1, 0

    def __len__(self) -> int:
        return self.n - self.consumed

    def state_dict(self, consumed: int | None = None) -> dict[str, int]:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch,
                "consumed": self.consumed if consumed is None else int(consumed)}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if int(state["n"]) != self.n:
            raise StateMismatchError(f"sampler was saved over {state['n']} items, this one has {self.n}")
        self.seed, self.epoch, self.consumed = int(state["seed"]), int(state["epoch"]), int(state["consumed"])


def training_state(*, model: "torch.nn.Module | None" = None, optimizer: Any = None, scheduler: Any = None,
                   scaler: Any = None, sampler: Any = None, step: int | None = None, extra: Any = None,
                   capture_rng: bool = True) -> dict[str, Any]:
    """The state :func:`resume` restores: each given part's ``state_dict()``, the RNG states
    (python, numpy, torch CPU and CUDA), the step and your ``extra`` (plain values/tensors).

    ``deltackpt.save(training_state(model=m, optimizer=opt, step=s), "ckpt", step=s)``"""
    out: dict[str, Any] = {}
    for name, part in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler),
                       ("scaler", scaler), ("sampler", sampler)):
        if part is not None:
            out[name] = part.state_dict()
    if capture_rng:
        out["rng"] = rng.capture()
    if step is not None:
        out["step"] = int(step)
    if extra is not None:
        out["extra"] = extra
    return out


@dataclass
class ResumeInfo:
    """What :func:`resume` restored: the version, its step, metrics, meta and ``extra``."""

    version: Version
    step: int | None
    metrics: dict[str, Any] = field(default_factory=dict)
    meta: Any = None
    extra: Any = None
    skipped: list[str] = field(default_factory=list)   # newer versions that failed to load


def _candidates(r: Repo, version: "str | Version") -> list[str]:
    if isinstance(version, str) and version in ("latest", "HEAD"):
        # newest first, including a version whose ref never moved, and one whose manifest is
        # damaged (its load fails typed, so it is skipped with a warning naming it)
        history = [vid for vid, _m in r.core.scan()]
        latest = r.core.latest()
        if latest in history:       # the ref names the newest committed one: try it first
            history.remove(latest)
            history.insert(0, latest)
        return history
    return [r.core.resolve(version)]


def resume(repo: "str | os.PathLike | Repo", *, model: "torch.nn.Module | None" = None, optimizer: Any = None,
           scheduler: Any = None, scaler: Any = None, sampler: Any = None, restore_rng: bool = True,
           version: "str | Version" = "latest", strict: bool = True) -> ResumeInfo | None:
    """Restore a training state saved with :func:`training_state` (or the same keys).

    ``version="latest"`` tries versions newest first and takes the first that loads and verifies
    (every chunk is hash-checked while loading); a corrupt or incomplete one is skipped with a
    warning.  Any other revision (``"best:val_loss"``, a tag, ``"latest~3"``) is restored or
    raises.  Nothing is applied to the model or optimizer until the whole version has loaded.
    What they hold now is used while loading: a chunk they already hold, or that a few stored
    deltas turn into the target, is not read again (a rollback within a run reads what differs).
    Returns None when the repository does not exist or holds no version (a fresh start).

    Example::

        info = deltackpt.resume("ckpt", model=model, optimizer=opt, scheduler=sched)
        start = info.step if info else 0
        deltackpt.resume("ckpt", model=model, version="best:val_loss")   # roll back
    """
    try:
        r = _repo(repo)
    except NotARepositoryError:
        return None
    async_save.drain(r.core)
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
    from .flatten import unflatten
    from .materialize import build_tensors, is_own_blob, read_blobs
    from .tensor_bytes import writable_bytes

    live: dict[str, Any] = {}
    if model is not None:
        live.update((f"model.{k}", t) for k, t in model.state_dict().items())
    if optimizer is not None and hasattr(optimizer, "state_dict"):
        for i, s in optimizer.state_dict().get("state", {}).items():
            live.update((f"optimizer.state.{i}.{k}", t) for k, t in s.items() if isinstance(t, torch.Tensor))
    m = r.core.manifest(vid)
    r.core.refresh_index()
    seeds = {}
    for e in m.tensors:
        t = live.get(e.name)
        if (isinstance(t, torch.Tensor) and is_own_blob(m, e) and list(t.shape) == e.shape
                and str(t.dtype).removeprefix("torch.") == e.dtype):
            src = writable_bytes(t)
            if src is not None:
                seeds[e.blob] = src
    chosen = list(range(len(m.tensors)))
    buffers = read_blobs(r.core, vid, m, (e.blob for e in m.tensors), seeds=seeds)
    tensors = build_tensors(m, chosen, buffers, "cpu")
    return unflatten(m.tree, tensors.__getitem__), r.core.version(vid)


def _apply(state: Any, v: Version, **parts: Any) -> None:
    if not isinstance(state, dict):
        raise StateMismatchError(f"version {v.short_id} is not a training state (a dict); use deltackpt.load")
    strict = parts.pop("strict")
    restore_rng = parts.pop("restore_rng")
    # a lazy save (to any repository) may still be copying the live tensors this writes into
    async_save.wait_snapshots()
    for name, target in parts.items():
        if target is None:
            continue
        if name not in state:
            raise StateMismatchError(f"version {v.short_id} holds no {name!r} entry to restore")
        if name == "model":
            target.load_state_dict(state[name], strict=strict)
        else:
            target.load_state_dict(state[name])
    if restore_rng and "rng" in state:
        rng.restore(state["rng"])


class Checkpointer:
    """Decides at every step whether to save, saves (in the background by default) and applies
    a retention policy after each save.

    ``policy``: a :mod:`~deltackpt.frontend.policies` object, an int (every N steps) or a list
    (save when any is due).  ``retention``: a :class:`~deltackpt.Retention` run as gc after every
    ``gc_every`` saves (in the background thread, after the save commits).  ``state`` passed to
    :meth:`step` may be a callable, called only when a save is due.  ``start_step``: the step a
    resumed run starts from (``resume(...).step``), so schedules continue instead of restarting.
    ``background``: ``"thread"`` or ``"process"``, as in :func:`deltackpt.save`.

    ``snapshot="lazy"`` with ``optimizer=opt`` (one or a list): background saves return before
    the optimizer's parameters and state are copied; ``opt.step()`` waits for the copy (see
    ``optimizer`` in :func:`deltackpt.save` for exactly what is safe, and
    ``self.last.wait_snapshot()`` for what is not).  ``snapshot="eager"`` (default) copies every
    tensor before :meth:`step` returns.

    :meth:`prepare` allocates and faults in the staging memory the background saves of a state
    will hold, in a background thread, so the first save costs what the later ones do.  The first
    :meth:`step` given a state (not a callable) calls it; with a callable, call it yourself.

    Example::

        ckpt = Checkpointer("ckpt", policy=YoungDaly(mtbf=4 * 3600), retention=Retention(keep_last=3))
        for step in range(1, n + 1):
            loss = train_step()
            ckpt.step(lambda: training_state(model=model, optimizer=opt, step=step), step=step,
                      metrics={"loss": loss})
        ckpt.close()     # waits for the last save
    """

    def __init__(self, repo: "str | os.PathLike | Repo", policy: "Policy | int | list | None" = None, *,
                 retention: Retention | None = None, blocking: bool = False, gc_every: int = 1,
                 encoding: Any = None, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                 start_step: int | None = None, clock: Callable[[], float] = time.monotonic,
                 background: str | None = None, snapshot: str = "eager", optimizer: Any = None) -> None:
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidArgumentError(f"retention must be a Retention, got {type(retention).__name__}")
        grace_seconds = check_seconds("grace_seconds", grace_seconds, allow_inf=True)  # before any I/O
        from .lazy import optimizers_of
        if snapshot not in ("eager", "lazy"):
            raise InvalidArgumentError(f"snapshot must be 'eager' or 'lazy', got {snapshot!r}")
        if snapshot == "lazy" and optimizer is None:
            raise InvalidArgumentError("snapshot='lazy' needs optimizer=: its step is what waits for the copy")
        self.snapshot = snapshot
        self.optimizers = optimizers_of(optimizer) if optimizer is not None else None
        self.repo = _repo(repo, create=True)
        self.background = background
        self.policy = as_policy(policy)
        self.retention = retention
        self.blocking = blocking
        self.gc_every = max(1, int(gc_every))
        self.encoding = encoding
        self.grace_seconds = grace_seconds
        self.clock = clock
        self.saves = 0
        self.stall_seconds = 0.0
        """Total seconds :meth:`step` blocked the caller for saves (snapshots, waits, blocking saves)."""
        self.last: "SaveHandle | Version | None" = None
        self._prepared = False
        if start_step is not None:  # resumed: step-based schedules continue, not restart at 0
            self.policy.resumed(start_step, self.clock())
            # metric-based ones remember the best so far (versions of an abandoned future excluded)
            self.policy.recall([dict(v.metrics) for v in reversed(self.repo.log())
                                if v.step is not None and v.step <= start_step])

    def due(self, step: int, metrics: Mapping[str, Any] | None = None) -> bool:
        return self.policy.due(step, self.clock(), metrics or {})

    def step(self, state: Any = None, *, step: int, metrics: Mapping[str, Any] | None = None, force: bool = False,
             meta: Any = None, tag: str | None = None) -> "SaveHandle | Version | None":
        """Save ``state`` if the policy says so (or ``force``); returns the handle/Version or None."""
        from .api import save

        metrics = dict(metrics or {})
        if not self._prepared and state is not None and not callable(state):
            self._prepared = True   # the state's size is known now: its staging faults in meanwhile
            try:
                self.prepare(state)
            except DeltackptError:
                pass   # a state that cannot be saved is refused by the save that tries it
        if not (force or self.due(step, metrics)):
            return None
        t0 = time.perf_counter()
        obj = state() if callable(state) else state
        if obj is None:
            raise DeltackptError("Checkpointer.step: a save is due but no state was given")
        lazy = self.optimizers if self.snapshot == "lazy" and not self.blocking else None
        result = save(obj, self.repo, step=step, metrics=metrics, meta=meta, tag=tag, encoding=self.encoding,
                      blocking=self.blocking, background=self.background, optimizer=lazy)
        self.saves += 1
        if self.retention is not None and self.saves % self.gc_every == 0:
            self._collect()
        cost = time.perf_counter() - t0
        self.stall_seconds += cost
        self.policy.saved(step, self.clock(), cost, metrics)
        self.last = result
        return result

    def prepare(self, state: Any) -> "Future[None] | None":
        """Allocate and fault in, in a background thread, the staging memory background saves of
        ``state`` (or ``state()``) hold: ``MAX_IN_FLIGHT`` copies, plus the one lent to the delta
        cache.  Call it once the state has its final shapes (after the first optimizer step, when
        the optimizer state exists); saves of another layout simply allocate their own.  Returns
        the background pre-fault's future (None for a blocking Checkpointer)."""
        from . import prefault
        from .flatten import flatten

        if self.blocking:
            return None   # a blocking save stages nothing
        obj = state() if callable(state) else state
        if isinstance(obj, torch.nn.Module):
            obj = obj.state_dict()
        _, leaves = flatten(obj)
        process = async_save.uses_process(self.repo, leaves, self.background)
        return prefault.prepare(leaves, process, prefault.sets_for(self.repo.core, async_save.MAX_IN_FLIGHT))

    def _collect(self) -> None:
        core, policy, grace = self.repo.core, self.retention, self.grace_seconds
        if self.blocking:
            run_gc(core, policy, grace_seconds=grace)
        else:
            async_save.run_after(core, lambda: run_gc(core, policy, grace_seconds=grace))

    def wait(self) -> Version | None:
        """Wait for saves (and gc) in flight; raise their errors.  Returns the last Version."""
        async_save.drain(self.repo.core)
        async_save._forget_done_lazy()   # the training thread, between steps: unhook the optimizers
        if isinstance(self.last, SaveHandle):
            return self.last.wait()
        return self.last

    def close(self) -> Version | None:
        return self.wait()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            async_save.drain_all()
