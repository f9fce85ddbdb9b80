"""A divergence guard: watches the values a training loop reports and, when they go bad (a NaN, a
loss spike, a loss that rose and stays up), rolls the live state back to the last good version by
itself.

When a watched value is non-finite, or a rule (:mod:`.detect`: by default a spike against the
recent healthy values, or a level risen well above its recent best) fires ``patience`` steps in
a row, the guard

1. estimates where the bad stretch began from the series' recent values (:mod:`.onset`): a rule
   fires some steps after the run went bad, and a version saved in between is bad already;
2. lets any background save in flight commit (it is judged like the others);
3. picks the newest version of this run saved at a step below ``bad_start - margin``
   (``bad_start``: the estimated onset) that no rollback abandoned (or the version ``target``
   names, e.g. ``"best:val_loss"``, judged among those: :mod:`.targets`), and *holds* it, so
   that retention and gc keep it while this process lives (:mod:`deltackpt.repo.maintain.holds`);
4. restores model, optimizer, scheduler, GradScaler, sampler and RNG in place, reading only the
   chunks that differ (:mod:`.rollback`), moves the data past the window that preceded the spike
   (``data="skip"``), reshuffles it (``"reseed"``) or replays it (``"replay"``), and scales the
   learning rate by ``lr_scale``;
5. marks every version of this run saved after that version as abandoned (never a target again,
   in this run or a resumed one), commits the restored state as a new version labelled in its
   meta (``deltackpt log`` shows "rollback to <version> (step N) at step M"), records the event
   in the repository (``deltackpt events``) and logs one line (logger ``"deltackpt"``, WARNING).

Under torch.distributed (initialized, more than one rank) every rank runs a guard and calls
``check`` at the same steps: the ranks combine their verdicts, so a fault seen on one rank rolls
every rank back, to the version rank 0 chooses, together (:mod:`.agree`).  Only rank 0 commits and
records; the other ranks restore model, optimizer, scheduler and GradScaler and keep their own
RNG and data position (the version holds rank 0's).

More than ``max_rollbacks`` rollbacks within ``window`` steps raise :class:`DivergenceError`.

Example::

    guard = Guard("ckpt", model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    ...
    rb = guard.check(step, {"loss": loss})
    if rb is not None:          # rolled back: carry on from rb.step with a new data iterator
        step = rb.step
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping


from ..api import Repo, internal, save
from ..errors import DeltackptError, DivergenceError, InvalidArgumentError
from ..api.internal import MAX_HELD, Hold, Version
from . import agree, onset, report, targets
from .detect import Rule, Verdict, default_rule
from .report import Rollback
from .rollback import Parts, Restored, roll_back
from .state import training_state

if TYPE_CHECKING:
    import torch

    from ..api.internal import SaveHandle
    from ..api.types import Metrics, Stateful

#: versions tried, newest first, when the chosen one does not restore (a damaged chunk)
MAX_TRIES = 4
#: values kept per watched series: the rules are rebuilt from them after a rollback
HISTORY = 512

log = logging.getLogger("deltackpt")



def _number(name: str, value: Any) -> float:
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"watched value {name!r} must be a number, got {type(value).__name__}")
    return float(value)


def _rules(watch: "str | Iterable[str] | Mapping[str, Rule]", rule: Rule | None) -> dict[str, Rule]:
    default = rule if rule is not None else default_rule()
    if not isinstance(default, Rule):
        raise InvalidArgumentError(f"rule must be a Spike, Sustained, Rules or other Rule, got "
                                   f"{type(default).__name__}")
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

    When a watched value is non-finite, or a rule fires ``patience`` steps in a row, the guard lets
    any background save in flight commit, estimates where the bad stretch began (its *onset*),
    picks the newest version of this run older than the onset by more than ``margin`` (or the one
    ``target`` names among those), restores every part given in place (reading only the chunks
    that differ), moves the data on as ``data`` says, marks the versions saved since as abandoned,
    commits the restored state as a new version labelled as a rollback, records the event and
    logs one line (the ``deltackpt`` logger, WARNING).  Under torch.distributed every rank judges
    its own values and all of them roll back together to the version rank 0 chose.

    Args:
        repo: the repository the run saves to (a path: the guard opens a handle of its own, which
            :meth:`close` closes); or give the guard to a :class:`~deltackpt.Checkpointer`, which
            attaches it.
        model: the module restored in place (any part may be None).
        optimizer: its optimizer.
        scheduler: a learning-rate scheduler (anything with ``state_dict``/``load_state_dict``).
        scaler: a ``GradScaler``.
        sampler: a :class:`~deltackpt.training.ResumableSampler` (or anything with
            ``state_dict``/``load_state_dict``), moved as ``data`` says.
        watch: the reported values judged, by name: ``"loss"``, ``["loss", "val_loss"]``, or
            ``{"loss": Rules(Spike(), Sustained()), "grad_norm": Spike(threshold=20)}`` (a gradient
            norm's level rises legitimately: give it a spike rule alone).
        rule: the rule for names given without one; default ``Rules(Spike(), Sustained())``, a spike
            above the recent healthy values or a level that rose well above its recent best and
            stays there (a non-finite value always fires).  A rule given is used as it is.
        patience: consecutive fires before rolling back (a non-finite value rolls back at once).
        margin: a version is a target only when its step is below ``bad_start - margin``, where
            ``bad_start`` is the step the bad stretch began at, as estimated from the series'
            recent values when the rule fires.  With the default 1, a bad loss first seen at step 33
            allows versions of step 31 or older: the version of step 32, whose weights produced
            that loss, is not trusted either.
        target: a revision preferred among the candidates (``"best:val_loss"``, a tag); otherwise
            the newest candidate.
        data: what happens to the data after the restore: ``"skip"`` (default) puts the sampler
            back where it was when the guard fired, so what was read since the target version is
            skipped (without a sampler the loop's data simply goes on, which is the same);
            ``"reseed"`` reshuffles the rest of the epoch with a seed drawn from ``seed`` and the
            step; ``"replay"`` replays it as it was (both need ``sampler``).
        lr_scale: multiply the restored learning rate (and the scheduler's base rates) by this.
        max_rollbacks: more rollbacks than this within ``window`` steps raise
            :class:`~deltackpt.DivergenceError` (the run keeps diverging: lower the learning rate
            or look at the data).
        window: the steps ``max_rollbacks`` counts over.
        restore_rng: restore the RNG states saved with the version (python, numpy, torch).
        commit: save the restored state as a new version (True), not (False), or a function
            ``commit(rollback) -> Version``.
        start_step: the step a resumed run resumed from (older versions of the repository at or
            before it are this run's).
        seed: the seed of ``data="reseed"``.
        skip_ahead: with ``data="skip"``, items skipped beyond the position where the guard fired
            (a bad shard usually goes on past the batch that showed it; PaLM's authors skipped a
            few hundred batches around each spike), within the epoch.
        group: under torch.distributed, the process group whose ranks roll back together
            (default: all of them).

    Raises:
        InvalidArgumentError: a setting out of range, or a ``data`` choice the sampler cannot do.

    Example:
        ```python
        guard = Guard(model=model, optimizer=opt, scheduler=sched, sampler=sampler, lr_scale=0.5)
        ckpt = Checkpointer("ckpt", policy=EveryN(50), guard=guard)
        ```
    """

    def __init__(self, repo: "str | os.PathLike[str] | Repo | None" = None, *, model: "torch.nn.Module | None" = None,
                 optimizer: "Stateful | None" = None, scheduler: "Stateful | None" = None,
                 scaler: "Stateful | None" = None, sampler: "Stateful | None" = None,
                 watch: "str | Iterable[str] | Mapping[str, Rule]" = "loss", rule: Rule | None = None,
                 patience: int = 1, margin: int = 1, target: str | None = None,
                 data: Literal["skip", "reseed", "replay"] = "skip",
                 lr_scale: float | None = None, max_rollbacks: int = 3, window: int = 1000,
                 restore_rng: bool = True, commit: "bool | Callable[[Rollback], Version | None]" = True,
                 start_step: int | None = None, seed: int = 0, skip_ahead: int = 0, group: Any = None) -> None:
        self.parts = Parts(model, optimizer, scheduler, scaler, sampler, restore_rng)
        self.parts.check(data)
        self._templates = _rules(watch, rule)
        self.rules = {name: r.fresh() for name, r in self._templates.items()}
        self.patience, self.margin = _count("patience", patience, 1), _count("margin", margin, 0)
        self.max_rollbacks, self.window = _count("max_rollbacks", max_rollbacks, 0), _count("window", window, 1)
        if lr_scale is not None and (isinstance(lr_scale, bool) or not isinstance(lr_scale, (int, float))
                                     or not 0 < lr_scale < float("inf")):
            raise InvalidArgumentError(f"lr_scale must be a positive number, got {lr_scale!r:.60}")
        if target is not None and not isinstance(target, str):
            raise InvalidArgumentError(f"target must be a revision string such as 'best:val_loss', got {target!r:.60}")
        self.target, self.data, self.lr_scale, self.commit, self.seed = target, data, lr_scale, commit, int(seed)
        self.skip_ahead = _count("skip_ahead", skip_ahead, 0)
        self.start_step, self.group = start_step, group
        self.run_id = secrets.token_hex(8)
        self.rollbacks: list[Rollback] = []
        self.repo: Repo | None = None
        self._owns_repo = False
        self._history: dict[str, deque[tuple[int, float, bool]]] = {name: deque(maxlen=HISTORY) for name in self.rules}

        self._bad_since: int | None = None
        self._flags = 0
        self._pending: list[tuple[int, SaveHandle]] = []
        self._mine: dict[str, int] = {}            # this run's versions -> step
        self._preexisting: set[str] = set()
        self._abandoned: set[str] = set()
        self._targets: list[str] = []              # versions rolled back to, newest first
        self._trusted: list[str] = []
        self._hold: Hold | None = None
        self._reach: str | None = None             # the newest version older than any onset a rule can name now
        self._names = ["nonfinite", *dict.fromkeys(n for r in self.rules.values() for n in r.names())]
        if repo is not None:
            self.attach(repo)

    # wiring ----------------------------------------------------------------------------------
    def attach(self, repo: "str | os.PathLike[str] | Repo", *, start_step: int | None = None) -> "Guard":
        """Use ``repo`` (a Checkpointer calls this with its own).

        Args:
            repo: the repository the run saves to (a path: the guard opens a handle of its own,
                which :meth:`close` closes).
            start_step: versions already there belong to this run only at or before this step (a
                resumed run); the rest are another run's.

        Returns:
            The guard itself.
        """
        self._owns_repo = not isinstance(repo, Repo)

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
        """Tell the guard this run saved ``step``: its newest trusted versions are held, so retention
        cannot drop the next rollback's target.

        Args:
            step: the step saved.
            result: the save's Version, or a background save's handle.
        """

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
        """Judge this step's reported values; roll back when they are bad.  Under torch.distributed
        every rank must call it at the same steps (it is a collective).

        Args:
            step: the training step.
            metrics: the values reported this step (``{"loss": 0.3, "grad_norm": 1.2}``); the
                watched ones are judged, a tensor's ``item()`` is taken.

        Returns:
            The :class:`Rollback` done (carry on from its ``step`` with a new data iterator), or
            None.

        Raises:
            DivergenceError: more than ``max_rollbacks`` rollbacks within ``window`` steps, or no
                version to roll back to.
            InvalidArgumentError: a watched value that is not a number, or no repository attached.
        """

        if self.repo is None:
            raise InvalidArgumentError("Guard has no repository: Guard(repo, ...) or Checkpointer(repo, guard=...)")
        _count("step", step, -(1 << 63))
        verdict = self._judge(step, metrics)
        fire: Verdict | None = None
        if verdict is not None:
            self._bad_since = step if self._bad_since is None else self._bad_since
            self._flags += 1
            if verdict.rule == "nonfinite" or self._flags >= self.patience:
                fire = verdict
        start = self._onset(fire) if fire is not None else step
        seen_on = None
        group = agree.Group.current(self.group)
        if group is not None:   # a fault seen on one rank is seen by all
            rows = group.verdicts(None if fire is None else agree.encode(fire, start, list(self.rules), self._names))
            if rows:
                fire, start, seen_on = agree.decode(rows, list(self.rules), self._names)
        if fire is None:
            if verdict is None:
                self._settle(step)
            return None
        return self._fire(step, fire, start, group, seen_on)

    def _judge(self, step: int, metrics: Metrics) -> Verdict | None:
        fired: Verdict | None = None
        values: dict[str, float] = {}
        for name, rule in self.rules.items():
            if name not in metrics:
                continue
            values[name] = value = _number(name, metrics[name])
            verdict = rule.judge(name, value)
            if verdict is not None and (fired is None or verdict.rule == "nonfinite"):
                fired = verdict
        for name, value in values.items():   # every rule sees the value; a spike rule keeps healthy ones
            self.rules[name].observe(value, fired is None)
            self._history[name].append((step, value, fired is None))
        if fired is None:
            self._flags, self._bad_since = 0, None
        return fired

    def _onset(self, verdict: Verdict) -> int:
        """Where the bad stretch that ``verdict`` ends began (:mod:`.onset`), at most the first
        step that fired in a row."""
        rule = self.rules[verdict.metric]
        limit, lookback = rule.healthy_limit(verdict)
        points = [(s, v) for s, v, _ in self._history[verdict.metric]]
        found = onset.estimate(points, limit, direction=rule.direction, lookback=lookback)
        return min(found, self._bad_since) if self._bad_since is not None else found

    def _reach_step(self) -> int | None:
        """The oldest step a rule could name as a bad stretch's start if it fired now."""
        oldest = None
        for name, rule in self.rules.items():
            history = self._history[name]
            if not history:
                continue
            back = rule.reach()
            if back is None:
                continue
            step = history[len(history) - min(len(history), max(1, back))][0]
            oldest = step if oldest is None else min(oldest, step)
        return oldest

    def _needs(self) -> tuple[str, ...]:
        return tuple(name for name in ("model", "optimizer", "scheduler", "scaler")
                     if getattr(self.parts, name) is not None)

    def _settle(self, step: int) -> None:
        """Note the background saves that committed; hold the newest versions a fire at the next
        step could roll back to (step at most ``step - margin``), and the newest one older than
        any start of a bad stretch a rule could name now, besides the rollback targets."""
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
        reach = self._reach_step()
        if reach is not None:
            newest += [v for s, v in trusted if s < reach - self.margin][:1]
        if newest != self._trusted:
            self._trusted = newest
            self._update_hold()

    def _update_hold(self, first: Iterable[str] = ()) -> list[str]:
        """Hold ``first``, the versions rolled back to and the newest trusted ones; returns what is held."""
        assert self._hold is not None
        wanted = list(dict.fromkeys([*first, *self._targets, *self._trusted]))[:MAX_HELD]
        return self._hold.set(wanted)

    # firing ----------------------------------------------------------------------------------
    def _fire(self, step: int, verdict: Verdict, bad_start: int, group: "agree.Group | None",
              seen_on: int | None) -> Rollback:
        assert self.repo is not None
        count = 1 + sum(1 for r in self.rollbacks if abs(r.from_step - step) < self.window)
        rank = "" if seen_on is None else f" on rank {seen_on}"
        where = f"{self.repo.location}: {verdict.metric}={verdict.value:g} ({verdict.rule}){rank} at step {step}"
        if count > self.max_rollbacks:
            raise DivergenceError(f"{where}: the run keeps diverging ({count - 1} rollbacks within {self.window} "
                                  f"steps, the most allowed); lower the learning rate or look at the data before "
                                  f"step {bad_start}")
        core = self.repo
        lead = group is None or group.rank == 0
        before = bad_start - self.margin
        order: list[targets.Candidate] = []
        if lead:
            core.wait()      # a save in flight commits first and is judged like the others
            self._settle(step)
            found = targets.candidates(core, before=before, excluded=self._abandoned, preexisting=self._preexisting,
                                       start_step=self.start_step, needs=self._needs())
            order = targets.choose(core, found, self.target)[:MAX_TRIES]
        if group is not None:           # rank 0's choice, on every rank
            order = [targets.Candidate(v, s, math.nan) for v, s in group.broadcast([(c.id, c.step) for c in order],
                                                                                   MAX_TRIES)]
        if not order:
            raise DivergenceError(f"{where}: no version of this run older than step {before} to roll back to "
                                  f"(the bad stretch began at step {bad_start})")
        done, chosen, tried = self._restore(order, step, where, group)
        abandoned = targets.later_than(core, chosen.step, self._preexisting) | {
            v for v, s in self._mine.items() if s > chosen.step}
        self._abandoned |= abandoned
        self._mine = {v: s for v, s in self._mine.items() if v not in abandoned}
        self._targets = [chosen.id] + [v for v in self._targets if v != chosen.id][:MAX_HELD - 4]
        self._trusted = [v for v in self._trusted if v not in abandoned]
        self._update_hold()
        rb = Rollback(verdict, step, bad_start, done.version, done.step if done.step is not None else chosen.step,
                      self.data, done.skipped, self.lr_scale, done.bytes_read, done.metadata_bytes, done.seconds,
                      sorted(abandoned), count, done.extra, tried=tried, seen_on=seen_on)
        rb.message = self._message(rb)
        if lead:   # one commit and one record for the whole job
            self._commit(rb)
            rb.event = internal.record_event(core, self._record(rb))
            log.warning(rb.message)
        self.rollbacks.append(rb)
        self._flags, self._bad_since = 0, None
        self._rewind(rb.step)
        return rb

    def _restore(self, order: list[targets.Candidate], step: int, where: str,
                 group: "agree.Group | None") -> tuple[Restored, targets.Candidate, list[str]]:
        assert self.repo is not None
        tried: list[str] = []
        last: DeltackptError | None = None
        p = self.parts
        # under torch.distributed the version holds rank 0's RNG and data position: the other
        # ranks restore the replicated state only
        parts = p if group is None or group.rank == 0 else Parts(p.model, p.optimizer, p.scheduler, p.scaler, None,
                                                                  False)
        for c in order[:MAX_TRIES]:
            done: Restored | None = None
            if c.id in self._update_hold(first=[c.id]):   # else gc removed it just now
                tried.append(c.id)
                try:
                    done = roll_back(self.repo, c.id, parts, data=self.data, lr_scale=self.lr_scale,
                                     seed=self.seed * 1_000_003 + step, skip_ahead=self.skip_ahead)
                except DeltackptError as exc:   # nothing applied (all or nothing): try an older one
                    last = exc
            ok = done is not None if group is None else group.all_ok(done is not None)
            if ok:
                assert done is not None
                return done, c, tried
        raise DivergenceError(f"{where}: no version restores (tried {', '.join(v[:10] for v in tried) or 'none'}): "
                              f"{last if last is not None else 'another rank could not restore it'}")

    def _rewind(self, to_step: int) -> None:
        """After a rollback to ``to_step``: forget the values reported after it and rebuild each
        rule from the rest, as they stood when the restored version was saved."""
        for name, template in self._templates.items():
            kept = [e for e in self._history[name] if e[0] <= to_step]
            self._history[name] = deque(kept, maxlen=HISTORY)
            rule = template.fresh()
            for _, value, healthy in kept:
                rule.observe(value, healthy)
            self.rules[name] = rule

    def rollback_state(self, rb: Rollback) -> dict[str, Any]:
        """The state committed after a rollback: every part the guard restores, the restored step and
        the version's ``extra``, as :func:`~deltackpt.training.training_state` lays it out.

        Args:
            rb: the rollback.

        Returns:
            The state dict.
        """
        p = self.parts
        return training_state(model=p.model, optimizer=p.optimizer, scheduler=p.scheduler, scaler=p.scaler,
                              sampler=p.sampler, step=rb.step, extra=rb.extra, capture_rng=p.restore_rng)

    @staticmethod
    def rollback_meta(rb: Rollback) -> dict[str, Any]:
        """The ``meta`` of the version a rollback commits: ``deltackpt log`` labels it with it
        ("rollback to <version> (step N) at step M")."""
        return report.meta(rb)

    def _commit(self, rb: Rollback) -> None:
        if self.commit is False:
            return
        assert self.repo is not None
        t0 = time.perf_counter()
        v = self.commit(rb) if callable(self.commit) else save(self.rollback_state(rb), self.repo, step=rb.step,
                                                               meta=self.rollback_meta(rb))
        if isinstance(v, Version):
            rb.committed = v
            self._mine[v.id] = v.step if v.step is not None else rb.step
        rb.commit_seconds = time.perf_counter() - t0

    def _message(self, rb: Rollback) -> str:
        assert self.repo is not None
        return report.message(rb, self.repo.location, self.max_rollbacks, self.window)

    def _record(self, rb: Rollback) -> dict[str, Any]:
        history = self._history.get(rb.verdict.metric, ())
        return report.record(rb, self.run_id, [(s, x) for s, x, _ in history])
