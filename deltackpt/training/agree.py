"""The ranks of a torch.distributed job agreeing on a divergence guard's rollback.

Each rank judges its own values (a fault may show on one rank only: a bad batch, a bit flip in
its replica).  At every check the ranks combine their verdicts (one all-reduce of a flag; when any
rank fired, an all-gather of each rank's verdict and onset), so a fault seen by one rank is seen
by all.  Rank 0 of the group chooses the target and broadcasts the versions to try, every rank
restores them in that order until all have restored the same one, and only rank 0 commits the
restored state and records the event.  Only numbers travel (tensors, no pickled objects).

Example::

    group = Group.current(None)          # None when torch.distributed is not initialized
    rows = group.verdicts(row if fired else None)
    order = group.broadcast(order if group.rank == 0 else [])
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from .detect import Verdict

#: onset, value, threshold, baseline, metric index, rule index
WIDTH = 6


class Group:
    """The process group a guard's ranks agree in (``group=None``: the default, every rank)."""

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.src = dist.get_global_rank(group, 0) if group is not None else 0
        # tensors where the backend takes them: NCCL only moves CUDA tensors
        backend = str(dist.get_backend(group))
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    @classmethod
    def current(cls, group: Any) -> "Group | None":
        """The group when torch.distributed is initialized and it has more than one rank, else None."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        found = cls(group)
        return found if found.size > 1 else None

    def verdicts(self, row: Sequence[float] | None) -> list[list[float] | None]:
        """Every rank's row (None: that rank did not fire); [] when no rank fired.  Collective."""
        flag = torch.tensor([0.0 if row is None else 1.0], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX, group=self.group)
        if flag.item() == 0:
            return []
        mine = torch.tensor([1.0, *row] if row is not None else [0.0] * (WIDTH + 1), dtype=torch.float64,
                            device=self.device)
        rows = [torch.empty_like(mine) for _ in range(self.size)]
        self.dist.all_gather(rows, mine, group=self.group)
        return [r[1:].tolist() if r[0].item() == 1.0 else None for r in (x.cpu() for x in rows)]

    def broadcast(self, order: Sequence[tuple[str, int]], most: int) -> list[tuple[str, int]]:
        """Rank 0's ``(version id, step)`` list (at most ``most``), on every rank.  Collective."""
        data = torch.zeros(1 + 3 * most, dtype=torch.int64)
        if self.rank == 0:
            data[0] = min(len(order), most)
            for i, (vid, step) in enumerate(order[:most]):
                data[1 + 3 * i: 4 + 3 * i] = torch.tensor([*_id_words(vid), step], dtype=torch.int64)
        data = data.to(self.device)
        self.dist.broadcast(data, src=self.src, group=self.group)
        got = data.cpu().tolist()
        return [(_id_text(got[1 + 3 * i], got[2 + 3 * i]), got[3 + 3 * i]) for i in range(got[0])]

    def all_ok(self, ok: bool) -> bool:
        """True when ``ok`` on every rank.  Collective."""
        flag = torch.tensor([1.0 if ok else 0.0], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN, group=self.group)
        return flag.item() == 1.0


def encode(verdict: Verdict, onset: int, metrics: Sequence[str], rules: Sequence[str]) -> list[float]:
    """A verdict and its onset as the numbers :meth:`Group.verdicts` gathers."""
    nan = math.nan
    return [float(onset), verdict.value, nan if verdict.threshold is None else verdict.threshold,
            nan if verdict.baseline is None else verdict.baseline, float(_index(metrics, verdict.metric)),
            float(_index(rules, verdict.rule))]


def decode(rows: Sequence[list[float] | None], metrics: Sequence[str],
           rules: Sequence[str]) -> tuple[Verdict, int, int]:
    """The verdict of the lowest rank that fired, the earliest onset among the ranks that fired,
    and that rank."""
    fired = [(rank, r) for rank, r in enumerate(rows) if r is not None]
    rank, row = fired[0]
    onset = min(int(r[0]) for _, r in fired)
    metric = metrics[int(row[4])] if 0 <= int(row[4]) < len(metrics) else "?"
    rule = rules[int(row[5])] if 0 <= int(row[5]) < len(rules) else "?"
    opt = lambda x: None if math.isnan(x) else x  # noqa: E731
    return Verdict(metric, rule, row[1], opt(row[2]), opt(row[3])), onset, rank


def _index(names: Sequence[str], name: str) -> int:
    return names.index(name) if name in names else -1


def _id_words(vid: str) -> tuple[int, int]:
    """A 32-hex-digit version id as two signed 64-bit integers."""
    hi, lo = int(vid[:16], 16), int(vid[16:32], 16)
    return (hi - (1 << 64) if hi >= 1 << 63 else hi), (lo - (1 << 64) if lo >= 1 << 63 else lo)


def _id_text(hi: int, lo: int) -> str:
    return f"{hi & ((1 << 64) - 1):016x}{lo & ((1 << 64) - 1):016x}"
