"""The failure simulation behind the policy_sim study: one job over a seeded failure trace, driven
by deltackpt's own policy objects in simulated time, and every policy of the report over every trace."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from deltackpt.training.policies import DenseEarly, EveryN, EveryT, OnImprovement, Policy, YoungDaly, AnyOf


@dataclass
class Costs:
    stall: float        # loop seconds blocked per save (snapshot or whole save)
    background: float   # seconds from the snapshot to the commit (0: committed when the stall ends)
    restore: float      # seconds from a failure to training again (restart + load)


@dataclass
class Result:
    stall: float = 0.0
    lost: float = 0.0
    restore: float = 0.0
    saves: int = 0
    failures: int = 0

    @property
    def total(self) -> float:
        return self.stall + self.lost + self.restore


def val_loss(step: int, rnd: random.Random) -> float:
    """A noisy decreasing curve, evaluated every 100 steps (for OnImprovement)."""
    return 2.0 / math.sqrt(1 + step / 500) + rnd.gauss(0, 0.01)


def simulate(make_policy, costs: Costs, steps: int, step_s: float, failures: list[float], seed: int) -> Result:
    res = Result()
    restore_s = costs.restore
    rnd = random.Random(seed)
    policy: Policy = make_policy()
    t, step, committed = 0.0, 0, 0
    pending: tuple[int, float] | None = None       # (step, commit time) of a save in flight
    fails = iter(failures)
    next_fail = next(fails, math.inf)
    while step < steps:
        if pending and pending[1] <= t:
            committed, pending = pending[0], None
        if t + step_s > next_fail:               # dies during this step (or during the last stall)
            if pending and pending[1] <= next_fail:
                committed = pending[0]
            res.lost += (step - committed) * step_s + max(0.0, next_fail - t)
            res.restore += restore_s
            res.failures += 1
            t = max(t, next_fail) + restore_s
            step, pending = committed, None
            policy = make_policy()               # a new process: fresh policy objects
            policy.resumed(step, t)
            while next_fail <= t:                # failures during the restore restart it
                next_fail = next(fails, math.inf)
                if next_fail <= t:
                    res.restore += restore_s
                    t = next_fail + restore_s
            continue
        t += step_s
        step += 1
        metrics = {"val_loss": val_loss(step, rnd)} if step % 100 == 0 else {}
        if policy.due(step, t, metrics):
            stall = costs.stall
            if pending:                          # at most one save in flight: wait for it
                stall += max(0.0, pending[1] - t)
                committed, pending = pending[0], None
            t += stall
            res.stall += stall
            res.saves += 1
            if costs.background > 0:
                pending = (step, t + costs.background)
            else:
                committed = step
            policy.saved(step, t, stall, metrics)
    return res


def run_policies(args, dk: Costs, ts: Costs, mtbf: float, steps: int, n_torch: int,
                 plain: Costs | None = None, only: set[str] | None = None) -> list[tuple]:
    """Each policy over every trace: (name, stall, lost, restore, total, saves, failures), means per job."""
    C = args.torch_save_s
    min_gap = dk.background   # no point saving faster than a save commits
    policies = [
        ("torch.save, fixed interval (Young/Daly-optimal for its cost)", ts, lambda: EveryN(n_torch)),
        ("torch.save, every 30 min", ts, lambda: EveryT(1800)),
        ("deltackpt async, same fixed interval", dk, lambda: EveryN(n_torch)),
        ("deltackpt async, every 30 min", dk, lambda: EveryT(1800)),
        ("deltackpt async, Young/Daly (measured cost)", dk,
         lambda: YoungDaly(mtbf, initial_cost=C, min_interval=min_gap)),
        ("deltackpt async, dense early (COCI-like)", dk,
         lambda: DenseEarly(first=max(1, n_torch // 16), growth=1.3, max_every=max(1, n_torch // 2))),
        ("deltackpt async, Young/Daly or val_loss improvement", dk,
         lambda: AnyOf(YoungDaly(mtbf, initial_cost=C, min_interval=min_gap),
                       OnImprovement("val_loss", min_delta=0.01))),
    ]
    if plain is not None:   # the same Young/Daly policy with the plain (non-lazy) background snapshot
        policies.append(("deltackpt async, plain snapshot, Young/Daly (measured cost)", plain,
                         lambda: YoungDaly(mtbf, initial_cost=C, min_interval=plain.background)))
    table = []
    for name, costs, make in policies:
        if only is not None and name not in only:
            continue
        agg = Result()
        for k in range(args.traces):
            fails = trace(args.seed + k, mtbf, steps * args.step_s * 3)
            r = simulate(make, costs, steps, args.step_s, fails, args.seed + k)
            for f in ("stall", "lost", "restore", "saves", "failures"):
                setattr(agg, f, getattr(agg, f) + getattr(r, f))
        n = args.traces
        table.append((name, agg.stall / n, agg.lost / n, agg.restore / n, agg.total / n, agg.saves / n,
                      agg.failures / n))
    return table


def trace(seed: int, mtbf_s: float, horizon_s: float) -> list[float]:
    rnd = random.Random(seed)
    out, t = [], 0.0
    while t < horizon_s:
        t += rnd.expovariate(1.0 / mtbf_s)
        out.append(t)
    return out
