"""Timing many small jobs on a shared, loaded machine: each job's best over the rounds, the rounds
interleaving every label job by job (starting each round with another label: the first to touch a
chunk finds it cold in cache), so that a burst of load from other processes hits one job of each
label alike instead of one label's whole pass (passes of whole sets gave decode figures that
swapped order from one workload to the next on the 2-core project machine at load 10)."""

from __future__ import annotations

import math
import time
from typing import Callable


def best_sums(jobs: dict[str, list[Callable[[], object]]], rounds: int) -> dict[str, float]:
    """Seconds per label: the sum over its jobs of each job's fastest run in ``rounds`` rounds."""
    best = {k: [math.inf] * len(v) for k, v in jobs.items()}
    longest = max((len(v) for v in jobs.values()), default=0)
    labels = list(jobs)
    for r in range(rounds):
        # the label that runs first on a chunk finds it cold in cache, the others warm: rotate
        order = labels[r % len(labels):] + labels[:r % len(labels)] if labels else []
        for i in range(longest):
            for k in order:
                v = jobs[k]
                if i < len(v):
                    t = time.perf_counter()
                    v[i]()
                    dt = time.perf_counter() - t
                    if dt < best[k][i]:
                        best[k][i] = dt
    return {k: sum(v) for k, v in best.items()}
