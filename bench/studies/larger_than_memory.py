"""States larger than memory: save a file-backed state (torch.from_file, MAP_SHARED) and restore
it into file-backed parameters, measuring time and peak extra anonymous memory (RssAnon, sampled
every 10 ms: the process's own heap; pages of the memory-mapped state are file cache, not counted,
and VmHWM is reported alongside for completeness).

usage:
    python -m bench larger_than_memory --size 8G [--dir /data/x] [--delta-cache 256M] [--json out.json]

Anchor, measured in the same run: copying the same state files with write + fsync (cp-like, 64 MiB
blocks), i.e. the disk's own speed for these bytes.  Refuses sizes >= 1 GiB when less than 12 GiB
of memory is available (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench.common.memory import PeakAnon, vm_hwm
from bench.common.scratch import scratch

SUMMARY = "a file-backed state larger than memory: save, incremental save and restore into file-backed parameters, time and peak anonymous memory"
WRITES = "stdout; --json FILE"
BLOCK = 64 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def make_files(folder: str, total: int, n: int) -> list[tuple[str, int]]:
    """``n`` files of float32 values, like weights (randn * 0.02), written in 64 MiB blocks."""
    rng = np.random.default_rng(0)
    per = (total // n) // 4 * 4
    out = []
    for i in range(n):
        path = os.path.join(folder, f"state{i:02d}.bin")
        with open(path, "wb") as f:
            left = per
            while left:
                k = min(BLOCK, left) // 4
                f.write((rng.standard_normal(k, dtype=np.float32) * 0.02).tobytes())
                left -= k * 4
        out.append((path, per // 4))
    return out


def copy_anchor(files: list[tuple[str, int]], folder: str) -> float:
    """Seconds to copy the state files with write + fsync: the disk's speed for these bytes."""
    t0 = time.perf_counter()
    for path, _n in files:
        dst = os.path.join(folder, os.path.basename(path) + ".copy")
        with open(path, "rb") as src, open(dst, "wb") as out:
            while True:
                block = src.read(BLOCK)
                if not block:
                    break
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.unlink(dst)
    return time.perf_counter() - t0


def _file_state(files: list[tuple[str, int]]) -> dict:
    """The state: one tensor memory-mapped (MAP_SHARED) from each file."""
    import torch
    state = {}
    for i, (path, n) in enumerate(files):
        cols = 1024 if n % 1024 == 0 else 1
        state[f"layer{i:02d}.weight"] = torch.from_file(path, shared=True, size=n, dtype=torch.float32).view(-1, cols)
    return state


def _file_model(files: list[tuple[str, int]], state: dict):
    """A model whose buffers are fresh sparse files, memory-mapped, named like the saved keys
    (restore maps names through the model's state_dict)."""
    import torch
    named = torch.nn.Module()
    for i, (path, n) in enumerate(files):
        dpath = path + ".restored"
        with open(dpath, "wb") as f:
            f.truncate(n * 4)
        sub = torch.nn.Module()
        sub.register_buffer("weight", torch.from_file(dpath, shared=True, size=n, dtype=torch.float32)
                            .view(state[f"layer{i:02d}.weight"].shape))
        named.add_module(f"layer{i:02d}", sub)
    return named


def _measure(work: str, size: int, tensors: int, delta_cache: int, anchor: bool) -> dict:
    import torch

    import deltackpt
    from bench.common.repo_internals import config
    t0 = time.perf_counter()
    files = make_files(work, size, tensors)
    gen_s = time.perf_counter() - t0
    anchor_s = copy_anchor(files, work) if anchor else None
    state = _file_state(files)
    repo_path = os.path.join(work, "repo")
    repo = deltackpt.Repo(repo_path, create=True, delta_cache_bytes=delta_cache)
    try:
        chunk = config(repo)["chunk_bytes"]
        with PeakAnon() as save_mem:
            t0 = time.perf_counter()
            v1 = repo.save(state, step=1)
            save_s = time.perf_counter() - t0
        w = state["layer00.weight"]   # an incremental step: 1% of the rows of one tensor change
        with torch.no_grad():
            w[: max(1, w.shape[0] // 100)] += 1e-3
        with PeakAnon() as inc_mem:
            t0 = time.perf_counter()
            v2 = repo.save(state, step=2)
            inc_s = time.perf_counter() - t0
    finally:
        repo.close()
    named = _file_model(files, state)   # restore into file-backed destinations
    repo = deltackpt.Repo(repo_path)     # a fresh handle: nothing of the saves in memory
    try:
        with PeakAnon() as restore_mem:
            t0 = time.perf_counter()
            repo.restore(named, v2.id)
            restore_s = time.perf_counter() - t0
        stored = repo.du()["total"]["stored_bytes"]
    finally:
        repo.close()
    same = all(torch.equal(state[k], named.state_dict()[k]) for k in state)
    return {
        "state_bytes": size, "tensors": len(files), "tensor_shape": list(state[f"layer{len(files) - 1:02d}.weight"].shape),
        "chunk_bytes": chunk, "delta_cache_bytes": delta_cache,
        "generate_s": round(gen_s, 2),
        "anchor_copy_fsync_s": None if anchor_s is None else round(anchor_s, 2),
        "save_s": round(save_s, 2), "save_MBps": round(size / save_s / 1e6, 1),
        "save_vs_copy": None if anchor_s is None else round(save_s / anchor_s, 2),
        "save_peak_extra_anon_MiB": round(save_mem.extra / 2**20, 1),
        "incremental_save_s": round(inc_s, 2),
        "incremental_written_bytes": v2.written_bytes,
        "incremental_peak_extra_anon_MiB": round(inc_mem.extra / 2**20, 1),
        "first_written_bytes": v1.written_bytes,
        "restore_s": round(restore_s, 2), "restore_MBps": round(size / restore_s / 1e6, 1),
        "restore_peak_extra_anon_MiB": round(restore_mem.extra / 2**20, 1),
        "restored_bit_identical": same, "repo_stored_bytes": stored,
        "process_VmHWM_MiB": round(vm_hwm() / 2**20, 1),
    }


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--size", default=None, help="state size (e.g. 8G, 256M; default 8G, quick 16M)")
    ap.add_argument("--tensors", type=int, default=None, help="default 16, quick 2")
    ap.add_argument("--dir", default=None, help="work folder (state files + repository), kept "
                    "(default: a scratch folder, removed however the run ends)")
    ap.add_argument("--delta-cache", default="256M", help="the repository's delta cache bound")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-anchor", action="store_true")


def run(args: argparse.Namespace) -> int:
    size = parse_size(args.size or ("16M" if args.quick else "8G"))
    import psutil
    avail = psutil.virtual_memory().available
    if size >= 1 << 30 and avail < 12 << 30:
        raise SystemExit(f"only {avail / 2**30:.1f} GiB of memory available (< 12 GiB): refusing on a shared machine")

    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with scratch("deltackpt-bench-large-", keep=args.dir, parent=args.tmp) as work:
            out = _measure(work, size, args.tensors or (2 if args.quick else 16), parse_size(args.delta_cache),
                           not args.no_anchor)
    finally:
        torch.set_num_threads(threads)
    out["available_memory_at_start_GiB"] = round(avail / 2**30, 1)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0 if out["restored_bit_identical"] else 1
