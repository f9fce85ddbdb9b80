"""Record the loss and gradient-norm series of clean real training runs, once, so the divergence
guard's rules can be replayed over them in a second (tests/training/test_guard_traces.py checks
that no default rule fires on any of them).

The runs are bench/workloads.py's (MiniLM full and frozen fine-tunes with AdamW, the recommendation
model with Zipf ids and SparseAdam, a small GPT from scratch), trained as bench/guard.py trains them
and at smaller batches (down to 1: the noisiest series), plus the MLP classifier of
examples/divergence.py.  Each is a list of ``[step, loss, grad_norm]``.

    python -m bench guard_clean_traces --record main              # about 15 min on 2 cores
    python -m bench guard_clean_traces --only gpt-b2 minilm-full-b1   # print some, store nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Iterator

import torch

from bench.common import workloads as w
from bench.common.record import record

STEPS = 300
SUMMARY = "the loss and gradient-norm series of clean real runs, recorded for the guard's no-false-alarm test"
WRITES = "--record KEY: bench/results/guard_traces.json"

# name -> factory(trace) running STEPS steps; versions=2 with every=STEPS-1: the generators clone
# the state only twice (a clone of MiniLM's full state is 260 MB)
RUNS: dict[str, Callable[[list], Iterator]] = {
    "minilm-full-b2": lambda t: w.minilm(2, every=STEPS - 1, batch=2, seq=8, trace=t),
    "minilm-full-b1": lambda t: w.minilm(2, every=STEPS - 1, batch=1, seq=8, seed=1, trace=t),
    "minilm-frozen-b2": lambda t: w.minilm(2, every=STEPS - 1, frozen=True, batch=2, seq=8, trace=t),
    "minilm-frozen-b16": lambda t: w.minilm(2, every=STEPS - 1, frozen=True, batch=16, seq=16, trace=t),
    "recsys-b64": lambda t: w.recsys(2, every=STEPS - 1, batch=64, trace=t),
    "recsys-b8": lambda t: w.recsys(2, every=STEPS - 1, rows=20_000, dim=16, batch=8, seed=1, trace=t),
    "gpt-b2": lambda t: w.gpt_bf16(2, every=STEPS - 1, vocab=512, dim=64, layers=2, seq=16, batch=2, trace=t),
    "gpt-b8": lambda t: w.gpt_bf16(2, every=STEPS - 1, vocab=2048, dim=128, layers=2, seq=32, batch=8, seed=1,
                                   trace=t),
}


def mlp_classifier(trace: list, steps: int = 900, seed: int = 0) -> Iterator[None]:
    """examples/divergence.py's clean run (an MLP classifier, SGD with momentum, StepLR, batches of
    32, 900 steps): a loss that falls by an order of magnitude, its relative noise growing as it does."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "examples"))
    import divergence as ex

    torch.manual_seed(seed)
    data, _ = ex.make_data()
    model = torch.nn.Sequential(torch.nn.Linear(ex.DIM, 128), torch.nn.ReLU(), torch.nn.Linear(128, ex.CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 200, gamma=0.5)
    sampler = ex.ResumableSampler(ex.N, seed=seed)
    loader = torch.utils.data.DataLoader(data, batch_size=ex.BATCH, sampler=sampler, generator=torch.Generator())
    step = 0
    while step < steps:
        for x, y, _ in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            w._note(trace, step + 1, loss, model.parameters())
            opt.step()
            sched.step()
            step += 1
            if step >= steps:
                break
    yield None


def trace_run(name: str, steps: int = STEPS) -> dict:
    trace: list = []
    t0 = time.perf_counter()
    for _ in (mlp_classifier(trace, steps) if name == "mlp-classifier" else RUNS[name](trace)):
        pass
    return {"seconds": round(time.perf_counter() - t0, 1), "trace": [[s, loss, g] for s, loss, g in trace]}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", nargs="*", choices=[*RUNS, "mlp-classifier"], default=None)
    ap.add_argument("--record", help="store the traces under this key in bench/results/guard_traces.json")


def run(args: argparse.Namespace) -> int:
    names = args.only or (["mlp-classifier"] if args.quick else [*RUNS, "mlp-classifier"])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for name in names:
            out[name] = trace_run(name, 60 if args.quick else 900) if name == "mlp-classifier" else trace_run(name)
            losses = [v for _, v, _ in out[name]["trace"]]
            print(json.dumps({"run": name, "steps": len(losses), "seconds": out[name]["seconds"],
                              "first": round(losses[0], 4), "last": round(losses[-1], 4),
                              "min": round(min(losses), 4), "max": round(max(losses), 4)}), flush=True)
            if args.quick:
                assert len(losses) == 60 and all(v == v for v in losses), name
    finally:
        torch.set_num_threads(threads)
    if args.record and not args.quick:
        record("guard_traces", args.record, {"runs": out, "command": "python -m bench guard_clean_traces "
                                             + " ".join(sys.argv[2:])})
    return 0
