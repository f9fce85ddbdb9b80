"""Pinned staging of a CUDA state: the bytes asked of torch's pinned-memory allocator.

A background save of a CUDA state copies it into pinned host memory.  torch's pinned allocator
rounds every allocation up to a power of two, so one pinned buffer per tensor (stop 39) kept 1.66x
a GPT-2 + AdamW state resident on an H200 (bench/CUDA.md).  Staging now carves the buffers out of
power-of-two slabs (deltackpt/snapshot/pinned_slabs.py).  This study needs no GPU: for real
states, it takes the staging layout the save takes (one buffer per tensor, one per shared storage)
as if every tensor were on a GPU, and counts, side by side:

* the state's bytes;
* one buffer per tensor: the bytes torch's allocator takes for them (each rounded up to a power
  of two), and the number of allocations;
* slabs: the bytes of the slabs (powers of two, so the allocator adds nothing), their number, and
  the CPU time :func:`pack` takes for the layout (once per layout: later saves reuse the slabs).

These are byte counts of the allocations, not a measured resident size: on the H200 the one
measurement (stop 39) kept 2388 MiB where the rounding predicted 2366 MiB.  The CUDA figure is for
``bench/cuda_check.sh`` on a GPU.

    python -m bench pinned_staging --quick          # tiny states, checks only
    python -m bench pinned_staging [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

SUMMARY = "pinned staging of a CUDA state: bytes asked of torch's pinned allocator, one buffer per tensor against slabs"
WRITES = "stdout; --json FILE (this stop's run: bench/results/pinned_staging.json)"

MIB = 1 << 20


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", help="write the figures here")


def _states(quick: bool) -> list[tuple[str, Any]]:
    """(name, a function making the state) for each workload: a model and its optimizer after one
    step, so that the optimizer's moments exist."""
    from bench.common import workloads as w

    def gpt2(cast: torch.dtype | None = None) -> dict:
        model, opt = w.gpt2_parts(tiny=quick)
        w.gpt2_backward(model, opt, torch.Generator().manual_seed(0), 1, 8)
        opt.step()
        if cast is not None:
            return {"model": {k: v.to(cast) for k, v in model.state_dict().items()}}
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}

    def minilm() -> dict:
        model, opt = w.minilm_parts(tiny=quick)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}

    def cnn() -> dict:
        return next(w.cnn(1, batch=4))

    return [("gpt2-adamw", gpt2), ("gpt2-bf16-weights", lambda: gpt2(torch.bfloat16)),
            ("minilm-full", minilm), ("cnn", cnn)]


def _pinned_sizes(state: dict) -> list[int]:
    """The bytes of each staging buffer a background save of ``state`` takes, as if every tensor
    were on a GPU, except 0-dim tensors (AdamW keeps its step counters on the CPU; a few bytes
    either way)."""
    from deltackpt.snapshot import staging
    from deltackpt.torchstate.flatten import flatten
    _, leaves = flatten(state)
    leaves = [leaf for leaf in leaves if leaf.tensor.dim() > 0]
    shared = staging.sharing(leaves)
    return [torch.Size(shape).numel() * dtype.itemsize for shape, dtype, _ in staging.buffer_layout(leaves, shared)]


def measure(name: str, state: dict) -> dict:
    from deltackpt.snapshot.pinned_slabs import pack, power_of_two_above
    sizes = _pinned_sizes(state)
    t0 = time.process_time()
    plan = pack(sizes)
    pack_s = time.process_time() - t0
    state_bytes = sum(sizes)
    per_tensor = sum(power_of_two_above(n) for n in sizes)
    slabs = sum(plan.slabs)
    return {"workload": name, "state_mib": state_bytes / MIB, "buffers": len(sizes),
            "per_tensor_mib": per_tensor / MIB, "per_tensor_x": per_tensor / state_bytes,
            "slabs_mib": slabs / MIB, "slabs_x": slabs / state_bytes, "slabs": len(plan.slabs),
            "above_state_mib": (slabs - state_bytes) / MIB, "pack_cpu_ms": pack_s * 1e3}


def run(args: argparse.Namespace) -> int:
    rows = [measure(name, make()) for name, make in _states(args.quick)]
    print("| state | MiB | buffers | one pinned buffer per tensor | slabs | slabs above the state | pack CPU |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['state_mib']:.1f} | {r['buffers']} | {r['per_tensor_mib']:.1f} MiB "
              f"({r['per_tensor_x']:.2f}x) | {r['slabs_mib']:.1f} MiB ({r['slabs_x']:.3f}x) in {r['slabs']} | "
              f"{r['above_state_mib']:.1f} MiB | {r['pack_cpu_ms']:.2f} ms |")
    for r in rows:   # what the slabs promise, on every state (quick mode included)
        assert r["state_mib"] <= r["slabs_mib"] <= r["per_tensor_mib"], r
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "torch": torch.__version__}, f, indent=1)
    return 0
