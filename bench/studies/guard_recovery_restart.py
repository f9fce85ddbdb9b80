"""The by-hand restart the guard_recovery study compares the guard with: a fresh process imports
torch, builds the workload's model and optimizer (as its training script would, without training)
and loads the ``torch.save`` file of the last good version into them.  Prints one JSON line of
timings.

    python -m bench.studies.guard_recovery_restart minilm-frozen /path/to/state.pt [tiny|full]
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.perf_counter()


def build(name: str, tiny: bool = False):
    import torch

    from bench.common import workloads as w
    if name.startswith("minilm"):
        from transformers import BertConfig, BertModel
        enc = BertModel(BertConfig.from_pretrained(w.minilm_dir(), **(w.TINY_BERT if tiny else {})))
        head = torch.nn.Linear(enc.config.hidden_size, 2)
        model = torch.nn.ModuleDict({"encoder": enc, "head": head})
        if name == "minilm-frozen":
            last = f"encoder.layer.{enc.config.num_hidden_layers - 1}."
            for n, p in enc.named_parameters():
                p.requires_grad = n.startswith(last) or n.startswith("pooler")
        return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5, weight_decay=0.01)
    if name == "recsys":
        rows, dim = (20_000, 16) if tiny else (400_000, 64)
        emb = torch.nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
        head = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        model = torch.nn.ModuleDict({"emb": emb, "head": head})
        return model, w.Optimizers(sparse=torch.optim.SparseAdam(list(emb.parameters()), lr=1e-3),
                                   dense=torch.optim.Adam(head.parameters(), lr=1e-3))
    raise SystemExit(f"unknown workload {name!r}")


def main(name: str, path: str, tiny: bool = False) -> None:
    import torch
    t_import = time.perf_counter()
    model, opt = build(name, tiny)
    t_built = time.perf_counter()
    state = torch.load(path, weights_only=True)
    t_loaded = time.perf_counter()
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    t_ready = time.perf_counter()
    print(json.dumps({"import_seconds": t_import - T0, "build_seconds": t_built - t_import,
                      "load_seconds": t_loaded - t_built, "apply_seconds": t_ready - t_loaded,
                      "in_process_seconds": t_ready - T0, "bytes_read": os.path.getsize(path)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:4] == ["tiny"])
