"""A divergence guard: watches the values a training loop reports and, when they go bad (a NaN, a
loss spike), rolls the live state back to the last good version by itself.

When a watched value is non-finite, or a spike rule (:mod:`.detect`) fires ``patience`` steps in a
row, the guard

1. lets any background save in flight commit (it is judged like the others);
2. picks the newest version of this run whose step is older than the first bad step by more than
   ``margin`` and that no rollback abandoned (or the version ``target`` names, e.g.
   ``"best:val_loss"``, judged among those: :mod:`.targets`), and *holds* it, so that retention
   and gc keep it while this process lives (:mod:`deltackpt.repo.maintain.holds`);
3. restores model, optimizer, scheduler, GradScaler, sampler and RNG in place, reading only the
   chunks that differ (:mod:`.rollback`), moves the data past the window that preceded the spike
   (``data="skip"``), reshuffles it (``"reseed"``) or replays it (``"replay"``), and scales the
   learning rate by ``lr_scale``;
4. marks every version of this run saved after that version as abandoned (never a target again,
   in this run or a resumed one), commits the restored state as a new version (so a crash now
   resumes from it, skip included) and records the event in the repository (``deltackpt log``).

More than ``max_rollbacks`` rollbacks within ``window`` steps raise :class:`DivergenceError`.

Example::

    guard = Guard("ckpt", model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    ...
    rb = guard.check(step, {"loss": loss})
    if rb is not None:          # rolled back: carry on from rb.step with a new data iterator
        step = rb.step
"""

from __future__ import annotations

import os
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping

from ..api import Repo, internal, save
from ..errors import DeltackptError, DivergenceError, InvalidArgumentError
from ..format.events import ROLLBACK
from ..format.limits import EVENT_MAX_TEXT, EVENT_MAX_VALUES, EVENT_MAX_VERSIONS
from ..api.internal import MAX_HELD, Hold, Version
from . import targets
from .detect import Rule, Spike, Verdict
from .rollback import Parts, Restored, roll_back
from .state import training_state

if TYPE_CHECKING:
    import torch

    from ..api.internal import SaveHandle
    from ..api.types import Metrics, Stateful

#: versions tried, newest first, when the chosen one does not restore (a damaged chunk)
MAX_TRIES = 4


@dataclass
class Rollback:
    """What a guard did when it fired.  ``step`` is the step the restored state is at: a loop
    that counts its own steps continues from it, with a new data iterator (the sampler moved)."""

    verdict: Verdict
    from_step: int
    bad_start: int
    version: Version
    step: int
    data: str
    skipped: list[list[int]] | None
    lr_scale: float | None
    bytes_read: int
    metadata_bytes: int
    seconds: float
    abandoned: list[str]
    count: int
    extra: Any = None
    committed: Version | None = None
    commit_seconds: float | None = None
    event: str | None = None
    tried: list[str] = field(default_factory=list)


def _number(name: str, value: Any) -> float:
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"watched value {name!r} must be a number, got {type(value).__name__}")
    return float(value)


def _rules(watch: "str | Iterable[str] | Mapping[str, Rule]", rule: Rule | None) -> dict[str, Rule]:
    default = rule if rule is not None else Spike()
    if not isinstance(default, Rule):
        raise InvalidArgumentError(f"rule must be a Spike, Ratio or other Rule, got {type(default).__name__}")
    if isinstance(watch, str):
        watch = [watch]
    pairs = watch.items() if isinstance(watch, Mapping) else ((name, default) for name in watch)
    out = {}
    for name, r in pairs:
        if not isinstance(name, str) or not isinstance(r, Rule):
            raise InvalidArgumentError(f"watch takes metric names (or name -> Rule), got {name!r:.60}: {r!r:.60}")
        out[name] = r.fresh()
    if not out:
        raise InvalidArgumentError("watch names no metric")
    return out


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r:.60}")
    return value


class Guard:
    """Roll a diverging run back to its last good version (see the module docstring).

    ``repo``: the repository the run saves to (or give the guard to a Checkpointer, which
    attaches it).  ``watch``: the reported values judged, by name (``"loss"``, ``["loss",
    "grad_norm"]``, or ``{"loss": Spike(), "val_acc": Spike(direction="down")}``); ``rule``: the
    rule for names given without one (default ``Spike()``).  ``patience``: consecutive spikes
    before firing (a non-finite value fires at once).  ``margin``: steps between the first bad
    step and the newest version taken (1: the version whose weights produced the first bad loss
    is not trusted either).  ``start_step``: the step a resumed run resumed from (older versions
    of the repository at or before it are this run's).  ``commit``: save the restored state as a
    new version (True), not (False), or a function ``commit(rollback) -> Version``.
    ``skip_ahead``: with ``data="skip"``, items skipped beyond the position where the guard fired
    (a bad shard usually goes on past the batch that showed it; PaLM's authors skipped a few
    hundred batches around each spike), within the epoch.
    """

    def __init__(self, repo: "str | os.PathLike[str] | Repo | None" = None, *, model: "torch.nn.Module | None" = None,
                 optimizer: "Stateful | None" = None, scheduler: "Stateful | None" = None,
                 scaler: "Stateful | None" = None, sampler: "Stateful | None" = None,
                 watch: "str | Iterable[str] | Mapping[str, Rule]" = "loss", rule: Rule | None = None,
                 patience: int = 1, margin: int = 1, target: str | None = None,
                 data: Literal["skip", "reseed", "replay"] = "skip",
                 lr_scale: float | None = None, max_rollbacks: int = 3, window: int = 1000,
                 restore_rng: bool = True, commit: "bool | Callable[[Rollback], Version | None]" = True,
                 start_step: int | None = None, seed: int = 0, skip_ahead: int = 0) -> None:
        self.parts = Parts(model, optimizer, scheduler, scaler, sampler, restore_rng)
        self.parts.check(data)
        self.rules = _rules(watch, rule)
        self.patience, self.margin = _count("patience", patience, 1), _count("margin", margin, 0)
        self.max_rollbacks, self.window = _count("max_rollbacks", max_rollbacks, 0), _count("window", window, 1)
        if lr_scale is not None and (isinstance(lr_scale, bool) or not isinstance(lr_scale, (int, float))
                                     or not 0 < lr_scale < float("inf")):
            raise InvalidArgumentError(f"lr_scale must be a positive number, got {lr_scale!r:.60}")
        if target is not None and not isinstance(target, str):
            raise InvalidArgumentError(f"target must be a revision string such as 'best:val_loss', got {target!r:.60}")
        self.target, self.data, self.lr_scale, self.commit, self.seed = target, data, lr_scale, commit, int(seed)
        self.skip_ahead = _count("skip_ahead", skip_ahead, 0)
        self.start_step = start_step
        self.run_id = secrets.token_hex(8)
        self.rollbacks: list[Rollback] = []
        self.repo: Repo | None = None
        self._owns_repo = False
        self._recent: dict[str, deque[list[float]]] = {name: deque(maxlen=EVENT_MAX_VALUES) for name in self.rules}
        self._bad_since: int | None = None
        self._flags = 0
        self._pending: list[tuple[int, SaveHandle]] = []
        self._mine: dict[str, int] = {}            # this run's versions -> step
        self._preexisting: set[str] = set()
        self._abandoned: set[str] = set()
        self._targets: list[str] = []              # versions rolled back to, newest first
        self._trusted: list[str] = []
        self._hold: Hold | None = None
        if repo is not None:
            self.attach(repo)

    # wiring ----------------------------------------------------------------------------------
    def attach(self, repo: "str | os.PathLike[str] | Repo", *, start_step: int | None = None) -> "Guard":
        """Use ``repo`` (a Checkpointer calls this with its own).  Versions already there belong to
        this run only at or before ``start_step`` (a resumed run); the rest are another run's."""
        self._owns_repo = not isinstance(repo, Repo)   # a path: the guard opened the handle, close() closes it
        self.repo = repo if isinstance(repo, Repo) else Repo(repo, create=True)
        core = self.repo
        if start_step is not None:
            self.start_step = start_step
        self._preexisting = set(internal.version_ids(core))
        self._abandoned |= internal.abandoned_versions(core)
        if self.start_step is not None:
            for c in targets.candidates(core, before=self.start_step + 1, excluded=self._abandoned,
                                        preexisting=self._preexisting, start_step=self.start_step,
                                        needs=self._needs()):
                self._mine[c.id] = c.step
        self._hold = internal.hold(core)
        return self

    def saved(self, step: int, result: "Version | SaveHandle | None") -> None:
        """Tell the guard this run saved ``step`` (a Version, or a background save's handle): its
        newest trusted versions are held, so retention cannot drop the next rollback's target."""
        if isinstance(result, Version):
            self._mine[result.id] = step
        elif result is not None:
            self._pending.append((step, result))

    def close(self) -> None:
        """End the holds (retention may drop the versions rolled back to from now on) and, when
        the guard opened the repository itself (it was given a path), close that handle."""
        if self._hold is not None:
            self._hold.release()
        if self._owns_repo and self.repo is not None:
            self._owns_repo = False
            self.repo.close()

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # judging ---------------------------------------------------------------------------------
    def check(self, step: int, metrics: Metrics) -> Rollback | None:
        """Judge this step's reported values; roll back when they are bad.  Returns the
        :class:`Rollback` done, or None.  Raises :class:`DivergenceError` past the cap."""
        if self.repo is None:
            raise InvalidArgumentError("Guard has no repository: Guard(repo, ...) or Checkpointer(repo, guard=...)")
        _count("step", step, -(1 << 63))
        verdict = self._judge(step, metrics)
        if verdict is None:
            self._settle(step)
            return None
        self._bad_since = step if self._bad_since is None else self._bad_since
        self._flags += 1
        if verdict.rule != "nonfinite" and self._flags < self.patience:
            return None
        return self._fire(step, verdict)

    def _judge(self, step: int, metrics: Metrics) -> Verdict | None:
        fired: Verdict | None = None
        healthy: dict[str, float] = {}
        for name, rule in self.rules.items():
            if name not in metrics:
                continue
            value = _number(name, metrics[name])
            self._recent[name].append([step, value])
            verdict = rule.judge(name, value)
            if verdict is None:
                healthy[name] = value
            elif fired is None or verdict.rule == "nonfinite":
                fired = verdict
        if fired is None:
            for name, value in healthy.items():
                self.rules[name].add(value)
            self._flags, self._bad_since = 0, None
        return fired

    def _needs(self) -> tuple[str, ...]:
        return tuple(name for name in ("model", "optimizer", "scheduler", "scaler")
                     if getattr(self.parts, name) is not None)

    def _settle(self, step: int) -> None:
        """Note the background saves that committed; hold the newest versions a fire at the next
        step could roll back to (step at most ``step - margin``), besides the rollback targets."""
        still = []
        for s, handle in self._pending:
            if not handle.done():
                still.append((s, handle))
            elif handle.exception() is None:
                self._mine[handle.wait().id] = s
        self._pending = still
        trusted = sorted(((s, v) for v, s in self._mine.items() if s <= step - self.margin
                          and v not in self._abandoned), reverse=True)
        newest = [v for _, v in trusted[:2]]
        if newest != self._trusted:
            self._trusted = newest
            self._update_hold()

    def _update_hold(self, first: Iterable[str] = ()) -> list[str]:
        """Hold ``first``, the versions rolled back to and the newest trusted ones; returns what is held."""
        assert self._hold is not None
        wanted = list(dict.fromkeys([*first, *self._targets, *self._trusted]))[:MAX_HELD]
        return self._hold.set(wanted)

    # firing ----------------------------------------------------------------------------------
    def _fire(self, step: int, verdict: Verdict) -> Rollback:
        assert self.repo is not None and self._bad_since is not None
        count = 1 + sum(1 for r in self.rollbacks if abs(r.from_step - step) < self.window)
        where = f"{self.repo.location}: {verdict.metric}={verdict.value:g} ({verdict.rule}) at step {step}"
        if count > self.max_rollbacks:
            raise DivergenceError(f"{where}: the run keeps diverging ({count - 1} rollbacks within {self.window} "
                                  f"steps, the most allowed); lower the learning rate or look at the data before "
                                  f"step {self._bad_since}")
        core = self.repo
        core.wait()      # a save in flight commits first and is judged like the others
        self._settle(step)
        bad_start, before = self._bad_since, self._bad_since - self.margin
        found = targets.candidates(core, before=before, excluded=self._abandoned, preexisting=self._preexisting,
                                   start_step=self.start_step, needs=self._needs())
        order = targets.choose(core, found, self.target)
        if not order:
            raise DivergenceError(f"{where}: no version of this run older than step {before} to roll back to")
        done, chosen, tried = self._restore(order, step, where)
        abandoned = targets.later_than(core, chosen.step, self._preexisting) | {
            v for v, s in self._mine.items() if s > chosen.step}
        self._abandoned |= abandoned
        self._mine = {v: s for v, s in self._mine.items() if v not in abandoned}
        self._targets = [chosen.id] + [v for v in self._targets if v != chosen.id][:MAX_HELD - 3]
        self._trusted = [v for v in self._trusted if v not in abandoned]
        self._update_hold()
        rb = Rollback(verdict, step, bad_start, done.version, done.step if done.step is not None else chosen.step,
                      self.data, done.skipped, self.lr_scale, done.bytes_read, done.metadata_bytes, done.seconds,
                      sorted(abandoned), count, done.extra, tried=tried)
        self._commit(rb)
        rb.event = internal.record_event(core, self._record(rb))
        self.rollbacks.append(rb)
        self._flags, self._bad_since = 0, None
        return rb

    def _restore(self, order: list[targets.Candidate], step: int,
                 where: str) -> tuple[Restored, targets.Candidate, list[str]]:
        assert self.repo is not None
        tried: list[str] = []
        last: DeltackptError | None = None
        for c in order[:MAX_TRIES]:
            if c.id not in self._update_hold(first=[c.id]):
                continue   # gc removed it just now
            tried.append(c.id)
            try:
                done = roll_back(self.repo, c.id, self.parts, data=self.data, lr_scale=self.lr_scale,
                                 seed=self.seed * 1_000_003 + step, skip_ahead=self.skip_ahead)
                return done, c, tried
            except DeltackptError as exc:   # nothing applied (all or nothing): try an older one
                last = exc
        raise DivergenceError(f"{where}: no version restores (tried {', '.join(v[:10] for v in tried) or 'none'}): "
                              f"{last}")

    def rollback_state(self, rb: Rollback) -> dict[str, Any]:
        """The state committed after a rollback: every part the guard restores, the restored
        step and the version's ``extra``, as :func:`training_state` lays it out."""
        p = self.parts
        return training_state(model=p.model, optimizer=p.optimizer, scheduler=p.scheduler, scaler=p.scaler,
                              sampler=p.sampler, step=rb.step, extra=rb.extra, capture_rng=p.restore_rng)

    def _commit(self, rb: Rollback) -> None:
        if self.commit is False:
            return
        assert self.repo is not None
        t0 = time.perf_counter()
        v = self.commit(rb) if callable(self.commit) else save(self.rollback_state(rb), self.repo, step=rb.step)
        if isinstance(v, Version):
            rb.committed = v
            self._mine[v.id] = v.step if v.step is not None else rb.step
        rb.commit_seconds = time.perf_counter() - t0

    def _record(self, rb: Rollback) -> dict[str, Any]:
        v = rb.verdict
        return {**internal.stamp(ROLLBACK), "run": self.run_id, "version": rb.version.id, "step": rb.from_step,
                "seconds": rb.seconds, "bytes_read": rb.bytes_read, "metric": v.metric[:EVENT_MAX_TEXT],
                "rule": v.rule, "value": v.value, "threshold": v.threshold, "baseline": v.baseline,
                "values": list(self._recent[v.metric]), "bad_start": rb.bad_start, "to_step": rb.step,
                "abandoned": rb.abandoned[:EVENT_MAX_VERSIONS],
                "committed": rb.committed.id if rb.committed else None, "data": rb.data, "skipped": rb.skipped,
                "lr_scale": rb.lr_scale, "count": rb.count, "commit_seconds": rb.commit_seconds}
