"""Record the loss and gradient-norm series of clean real training runs, once, so the divergence
guard's rules can be replayed over them in a second (tests/training/test_guard_traces.py checks
that no default rule fires on any of them).

The runs are bench/workloads.py's (MiniLM full and frozen fine-tunes with AdamW, the recommendation
model with Zipf ids and SparseAdam, a small GPT from scratch), trained as bench/guard.py trains them
and at smaller batches (down to 1: the noisiest series), plus the MLP classifier of
examples/divergence.py.  Each is a list of ``[step, loss, grad_norm]``.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/guard_traces.py --record main    # about 15 min on 2 cores
    PYTHONPATH=. python bench/guard_traces.py --only gpt-b2 minilm-full-b1         # print some, store nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Iterator

import torch

from bench import workloads as w
from bench.record import record

STEPS = 300

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
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
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


def run(name: str) -> dict:
    trace: list = []
    t0 = time.perf_counter()
    for _ in (mlp_classifier(trace) if name == "mlp-classifier" else RUNS[name](trace)):
        pass
    return {"seconds": round(time.perf_counter() - t0, 1), "trace": [[s, loss, g] for s, loss, g in trace]}


def main(argv: list[str] | None = None) -> int:
    names = [*RUNS, "mlp-classifier"]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=names, default=names)
    ap.add_argument("--record", help="store the traces under this key in bench/results/guard_traces.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    out = {}
    for name in args.only:
        out[name] = run(name)
        losses = [v for _, v, _ in out[name]["trace"]]
        print(json.dumps({"run": name, "steps": len(losses), "seconds": out[name]["seconds"],
                          "first": round(losses[0], 4), "last": round(losses[-1], 4),
                          "min": round(min(losses), 4), "max": round(max(losses), 4)}), flush=True)
    if args.record:
        record("guard_traces", args.record, {"runs": out, "command": "PYTHONPATH=. python bench/guard_traces.py "
                                             + " ".join(argv if argv is not None else sys.argv[1:])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
