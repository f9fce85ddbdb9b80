"""Trained versions kept on disk for the studies that replay them without training (delta_sizes,
codec_speed, write_policy): one ``.npz`` of flat arrays per version (bfloat16 as int16 bit
patterns) beside a ``.tsize`` file holding the ``torch.save`` size of the same state, the
denominator of every ratio.  A cache folder the user names keeps them between runs.
"""

from __future__ import annotations

import glob
import io
import os
from typing import Callable, Iterator

import numpy as np

#: the workloads that can be cached (bench/common/workloads.py runs; "-quick" ones are tiny)
NAMES = ("full", "frozen", "recsys", "gpt", "cnn", "gpt2", "gpt2-bf16")


def _makers(name: str, quick: bool) -> Callable[[int], Iterator[dict]]:
    from bench.common import workloads as wl
    if quick:
        g2 = dict(every=2, seq=16, tiny=True)
        return {"full": lambda n: wl.minilm(n, every=2, batch=2, seq=8, tiny=True),
                "frozen": lambda n: wl.minilm(n, every=2, frozen=True, batch=2, seq=8, tiny=True),
                "recsys": lambda n: wl.recsys(n, every=4, rows=20_000, dim=16, batch=64),
                "gpt": lambda n: wl.gpt_bf16(n, every=2, vocab=512, dim=64, layers=2, seq=16, batch=2),
                "cnn": lambda n: wl.cnn(n, every=2, batch=4, width=4),
                "gpt2": lambda n: wl.gpt2_adamw(n, **g2),
                "gpt2-bf16": lambda n: wl.gpt2_bf16_weights(n, **g2)}[name]
    return {"full": lambda n: wl.minilm(n), "frozen": lambda n: wl.minilm(n, frozen=True),
            "recsys": lambda n: wl.recsys(n), "gpt": lambda n: wl.gpt_bf16(n), "cnn": lambda n: wl.cnn(n),
            "gpt2": lambda n: wl.gpt2_adamw(n), "gpt2-bf16": lambda n: wl.gpt2_bf16_weights(n)}[name]


def _flat(prefix: str, obj, out: dict) -> None:
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous()
        out[prefix] = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().copy()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flat(f"{prefix}.{i}", v, out)


def generate(name: str, versions: int, cache: str, quick: bool = False) -> list[str]:
    """The ``.npz`` files of the first ``versions`` versions of workload ``name`` (one of NAMES),
    training it into ``cache`` first where fewer are there."""
    import torch
    if name not in NAMES:
        raise SystemExit(f"unknown workload {name!r} ({', '.join(NAMES)})")
    out = os.path.join(cache, name + ("-quick" if quick else ""))
    files = sorted(glob.glob(os.path.join(out, "v*.npz")))
    if len(files) >= versions:
        return files[:versions]
    os.makedirs(out, exist_ok=True)
    for state in _makers(name, quick)(versions):
        step = state["step"]
        d: dict = {}
        _flat("", state, d)
        buf = io.BytesIO()
        torch.save(state, buf)
        np.savez(os.path.join(out, f"v{step:06d}.npz"), **d)
        with open(os.path.join(out, f"v{step:06d}.tsize"), "w") as f:
            f.write(str(len(buf.getvalue())))
    return sorted(glob.glob(os.path.join(out, "v*.npz")))[:versions]


def tensors(path: str) -> tuple[dict[str, np.ndarray], int]:
    """A cached version's arrays (bfloat16 as int16 bit patterns) and its torch.save size."""
    z = np.load(path)
    with open(path[:-4] + ".tsize") as f:
        return {k: z[k] for k in z.files}, int(f.read())
