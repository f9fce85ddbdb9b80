"""A training state on a GPU: what a save stalls the loop and what a restore straight into device
memory costs, against ``torch.save`` / ``torch.load(map_location="cuda")`` and DCP's
``async_save``, measured in one process on one GPU.

The state is GPT-2 small (``GPT2Config()``, random init, fp32) with AdamW, on the GPU: 1424 MiB of
weights and both moments, every one changing at every step (batch 4 x 128 random tokens).  Each
round trains ``--steps`` steps, then saves the same state five ways:

* ``torch.save`` + fsync (blocking: torch copies each storage to the host itself);
* ``deltackpt.save`` blocking (device tensors are read through a reused pinned buffer a chunk at a
  time);
* ``deltackpt.save(blocking=False, optimizer=opt)`` (the lazy snapshot: pinned host staging filled
  on a side stream, the optimizer's next step waits on its event); ``--steps`` more steps run while
  it writes;
* ``dcp.async_save`` (no process group), the same steps after it.

Recorded per save: the stall (wall time of the call, the GPU synchronized before and after), the
time until it is durable, the training steps' time while it runs (against the same steps with no
save), host memory the process keeps and the peak above it.  Floors measured in the same run: the
whole state copied device -> pinned host (what any staging must move) and device -> device.

Then the newest version is restored, warm (page cache) and cold (files fsynced and evicted,
bench/common/coldcache.py), ``--rounds`` times each, every one checked bit for bit against the
state that was saved:

* ``torch.load(map_location="cuda")`` of the torch.save file, then ``load_state_dict`` into the live
  model and optimizer (the anchor);
* ``deltackpt.load(map_location="cuda")`` (fresh device tensors: decoded on every core into pinned
  host windows, each window's bytes copied to the GPU while the next one decodes);
* ``deltackpt.restore(model, optimizer=opt)`` into the live GPU model and optimizer.

Last, ``deltackpt.load`` onto the device again, warm, with each size of the per-thread window
(host memory held: two windows per decode thread).

    python -m bench cuda_checkpoint --quick           # tiny GPT-2, on the GPU if any, else the CPU
    python -m bench cuda_checkpoint [--rounds 3] [--steps 20] [--json out.json] [--record KEY]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from typing import Any, Callable

SUMMARY = "a GPU training state: save stall, pinned staging, restore into device memory, against torch.save/load and DCP"
WRITES = "stdout; --json FILE; --record KEY -> bench/results/cuda_checkpoint.json"

BATCH, SEQ = 4, 128


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=3, help="save rounds, and restores of each kind (default 3)")
    ap.add_argument("--steps", type=int, default=20, help="training steps between saves (default 20)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--record", metavar="KEY", help="store the results as run KEY of bench/results/cuda_checkpoint.json")


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device, fn: Callable[[], Any]) -> tuple[float, Any]:
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t, out


def _tensors(obj: Any, prefix: str = "") -> dict[str, Any]:
    import torch
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    if isinstance(obj, dict):
        return {k: v for key, sub in obj.items() for k, v in _tensors(sub, f"{prefix}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, sub in enumerate(obj) for k, v in _tensors(sub, f"{prefix}/{i}").items()}
    return {}


def _bits(t):
    import torch
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else t


def _same(expected: dict[str, Any], got: Any) -> bool:
    flat = _tensors(got)
    if set(flat) != set(expected):
        return False
    return all(torch_equal(_bits(expected[k]), _bits(flat[k].to(expected[k].device))) for k in expected)


def torch_equal(a, b) -> bool:
    import torch
    return a.shape == b.shape and bool(torch.equal(a, b))


class _Run:
    """The model, optimizer and data of the run, on ``device``."""

    def __init__(self, device, tiny: bool) -> None:
        import torch
        from bench.common.workloads import gpt2_parts
        model, _ = gpt2_parts(0, tiny)
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.01)
        self.device = device
        self.vocab = self.model.config.vocab_size
        self.seq = min(SEQ, self.model.config.n_positions)
        self.g = torch.Generator(device=device).manual_seed(0)
        self.steps = 0

    def step(self) -> None:
        import torch
        ids = torch.randint(0, self.vocab, (BATCH, self.seq), generator=self.g, device=self.device)
        loss = self.model(input_ids=ids, labels=ids).loss
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        self.opt.step()
        self.steps += 1

    def train(self, n: int) -> float:
        """Seconds for ``n`` steps, the GPU synchronized at both ends."""
        return _timed(self.device, lambda: [self.step() for _ in range(n)])[0]

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "step": self.steps}

    def snapshot(self) -> dict[str, Any]:
        """A copy of every tensor's bits on the device: what a restore must give back."""
        return {k: _bits(v).clone() for k, v in _tensors(self.state()).items()}


def _floors(run: _Run) -> dict[str, float]:
    """Seconds to copy the whole state device -> pinned host and device -> device (what any
    snapshot moves), each the best of three."""
    import torch
    tensors, seen = [], set()
    for t in _tensors(run.state()).values():   # a tied weight once
        if t.numel() and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            tensors.append(t)
    n = sum(t.numel() * t.element_size() for t in tensors)
    out: dict[str, float] = {"state_bytes": n}
    if run.device.type != "cuda":
        return out
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    spare = torch.empty(n, dtype=torch.uint8, device=run.device)

    def copy_into(dst) -> None:
        pos = 0
        for t in tensors:
            b = _bits(t)
            dst[pos:pos + b.numel()].copy_(b, non_blocking=True)
            pos += b.numel()

    out["d2h_pinned_s"] = min(_timed(run.device, lambda: copy_into(pinned))[0] for _ in range(3))
    out["d2d_s"] = min(_timed(run.device, lambda: copy_into(spare))[0] for _ in range(3))
    return out


def _saves(run: _Run, folder: str, rounds: int, steps: int) -> tuple[list[dict], str, str]:
    import torch
    import torch.distributed.checkpoint as dcp

    import deltackpt
    from bench.common.memory import PeakAnon, settled_rss
    from bench.common.systems import folder_bytes, torch_save_file
    repo_path, torch_file = os.path.join(folder, "repo"), os.path.join(folder, "torch.pt")
    repo = deltackpt.Repo(repo_path, create=True)
    out = []
    for r in range(rounds):
        row: dict[str, Any] = {"round": r}
        row["steps_alone_s"] = run.train(steps)
        base = settled_rss()
        with PeakAnon() as mem:
            row["torch_save_fsync_s"] = _timed(run.device, lambda: torch_save_file(run.state(), torch_file, fsync=True))[0]
        row["torch_save_peak_host_MiB"] = mem.extra / 2**20
        before = folder_bytes(repo_path)
        with PeakAnon() as mem:
            row["deltackpt_blocking_s"] = _timed(run.device, lambda: repo.save(run.state(), step=run.steps))[0]
        row["deltackpt_blocking_written_MiB"] = (folder_bytes(repo_path) - before) / 2**20
        row["deltackpt_blocking_peak_host_MiB"] = mem.extra / 2**20
        row["deltackpt_blocking_kept_host_MiB"] = (settled_rss() - base) / 2**20
        row["steps_before_background_s"] = run.train(steps)

        t0 = time.perf_counter()
        with PeakAnon() as mem:
            row["deltackpt_background_stall_s"], h = _timed(
                run.device, lambda: repo.save(run.state(), step=run.steps, blocking=False, optimizer=run.opt))
            row["steps_during_deltackpt_s"] = run.train(steps)
            h.wait()
        row["deltackpt_background_durable_s"] = time.perf_counter() - t0
        row["deltackpt_background_peak_host_MiB"] = mem.extra / 2**20
        row["deltackpt_background_kept_host_MiB"] = (settled_rss() - base) / 2**20
        row["deltackpt_staged_MiB"] = h.staged_bytes / 2**20
        # the staging the handle keeps for the next background save (pinned slabs: their bytes,
        # what torch's pinned allocator was asked for) beside the resident figure above
        row["deltackpt_staging_pool_MiB"] = repo.runtime.staging.free_bytes / 2**20
        row["deltackpt_lazy_MiB"] = h.lazy_bytes / 2**20
        row["deltackpt_handle_stall_s"] = h.stall_seconds

        d = os.path.join(folder, f"dcp-{r}")
        t0 = time.perf_counter()
        with PeakAnon() as mem:
            row["dcp_async_stall_s"], fut = _timed(
                run.device, lambda: dcp.async_save(run.state(), checkpoint_id=d, no_dist=True))
            row["steps_during_dcp_s"] = run.train(steps)
            fut.result()
        row["dcp_async_durable_s"] = time.perf_counter() - t0
        row["dcp_async_peak_host_MiB"] = mem.extra / 2**20
        shutil.rmtree(d, ignore_errors=True)
        out.append(row)
        print(json.dumps(row), flush=True)
    torch.cuda.empty_cache() if run.device.type == "cuda" else None
    return out, repo_path, torch_file


def _restores(run: _Run, repo_path: str, torch_file: str, rounds: int) -> list[dict]:
    import torch

    import deltackpt
    from bench.common import coldcache
    from bench.common.memory import PeakAnon
    from bench.common.systems import torch_save_file

    # the newest version and the torch.save file hold the same state, the one checked against
    run.train(1)
    expected = run.snapshot()
    torch_save_file(run.state(), torch_file, fsync=True)
    deltackpt.save(run.state(), repo_path, step=run.steps)
    files = coldcache.files_under(repo_path, torch_file)
    dev = run.device

    def torch_load():
        return torch.load(torch_file, map_location=dev, weights_only=True)

    def torch_into_live():
        state = torch.load(torch_file, map_location=dev, weights_only=True)
        run.model.load_state_dict(state["model"])
        run.opt.load_state_dict(state["optimizer"])
        return run.state()

    def deltackpt_load():
        return deltackpt.load(repo_path, map_location=dev)

    def deltackpt_into_live():
        deltackpt.restore(run.model, repo_path, optimizer=run.opt)
        return run.state()

    kinds = {"torch.load": torch_load, "deltackpt.load": deltackpt_load,
             "torch.load+load_state_dict": torch_into_live, "deltackpt.restore": deltackpt_into_live}
    out = []
    for r in range(rounds):
        for cache in ("warm", "cold"):
            for name, fn in kinds.items():
                if cache == "cold":
                    coldcache.sync(files, evict=True)
                else:
                    coldcache.warm(files)
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                gpu_before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
                io_before = coldcache.io_read_bytes()
                with PeakAnon() as mem:
                    seconds, got = _timed(dev, fn)
                row = {"round": r, "cache": cache, "kind": name, "seconds": seconds,
                       "peak_host_MiB": mem.extra / 2**20,
                       "gpu_peak_extra_MiB": ((torch.cuda.max_memory_allocated(dev) - gpu_before) / 2**20
                                              if dev.type == "cuda" else 0.0),
                       "read_MiB": (coldcache.io_read_bytes() - io_before) / 2**20,
                       "bit_identical": _same(expected, got)}
                del got
                out.append(row)
                print(json.dumps(row), flush=True)
    return out


def _window_sweep(run: _Run, repo_path: str, sizes: list[int]) -> list[dict]:
    """``deltackpt.load(map_location=...)`` warm with each per-thread window size (the host memory
    a restore onto the device holds is two windows per decode thread): best of two each."""
    import deltackpt
    from bench.common import coldcache
    from bench.common.memory import PeakAnon
    from deltackpt.torchstate import to_device
    from deltackpt.torchstate.materialize import read_threads
    default = to_device.WINDOW_BYTES
    coldcache.warm(coldcache.files_under(repo_path))
    out = []
    try:
        for mib in sizes:
            to_device.WINDOW_BYTES = mib << 20
            best, peak = float("inf"), 0
            for _ in range(2):
                with PeakAnon() as mem:
                    seconds, got = _timed(run.device, lambda: deltackpt.load(repo_path, map_location=run.device))
                del got
                best, peak = min(best, seconds), max(peak, mem.extra)
            row = {"window_MiB": mib, "threads": read_threads(), "seconds": best, "peak_host_MiB": peak / 2**20}
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        to_device.WINDOW_BYTES = default
    return out


#: what each restore is compared with: a load with a load, a restore into the live model with a
#: load plus load_state_dict
_ANCHOR = {"torch.load": "torch.load", "deltackpt.load": "torch.load",
           "torch.load+load_state_dict": "torch.load+load_state_dict",
           "deltackpt.restore": "torch.load+load_state_dict"}


def _summary(result: dict) -> str:
    saves, loads = result["saves"], result["restores"]
    later = saves[1:] or saves

    def med(key: str, rows=later) -> float:
        return statistics.median(r[key] for r in rows)

    anchor = med("torch_save_fsync_s")
    alone = med("steps_alone_s")
    lines = [f"device: {result['device']}; state {result['floors']['state_bytes'] / 2**20:.0f} MiB; "
             f"{result['steps']} steps between saves take {alone:.3f} s alone",
             f"floors: device->pinned host {result['floors'].get('d2h_pinned_s', float('nan')):.3f} s, "
             f"device->device {result['floors'].get('d2d_s', float('nan')):.3f} s",
             "| save (median of later rounds) | stall s | x torch.save+fsync | durable s | steps while it runs s | host peak MiB |",
             "|---|---|---|---|---|---|",
             f"| torch.save+fsync | {anchor:.3f} | 1.00x | {anchor:.3f} | - | {med('torch_save_peak_host_MiB'):.0f} |",
             f"| deltackpt blocking | {med('deltackpt_blocking_s'):.3f} | {med('deltackpt_blocking_s') / anchor:.2f}x | "
             f"{med('deltackpt_blocking_s'):.3f} | - | {med('deltackpt_blocking_peak_host_MiB'):.0f} |",
             f"| deltackpt background (lazy) | {med('deltackpt_background_stall_s'):.3f} | "
             f"{med('deltackpt_background_stall_s') / anchor:.2f}x | {med('deltackpt_background_durable_s'):.3f} | "
             f"{med('steps_during_deltackpt_s'):.3f} ({med('steps_during_deltackpt_s') / alone:.2f}x alone) | "
             f"{med('deltackpt_background_peak_host_MiB'):.0f} |",
             f"| DCP async_save | {med('dcp_async_stall_s'):.3f} | {med('dcp_async_stall_s') / anchor:.2f}x | "
             f"{med('dcp_async_durable_s'):.3f} | {med('steps_during_dcp_s'):.3f} "
             f"({med('steps_during_dcp_s') / alone:.2f}x alone) | {med('dcp_async_peak_host_MiB'):.0f} |",
             f"first background save stall {saves[0]['deltackpt_background_stall_s']:.3f} s; "
             f"written per blocking save {med('deltackpt_blocking_written_MiB'):.0f} MiB",
             f"host memory kept after the background save {med('deltackpt_background_kept_host_MiB'):.0f} MiB "
             f"(state {result['floors']['state_bytes'] / 2**20:.0f} MiB); staging the handle keeps "
             f"{med('deltackpt_staging_pool_MiB'):.0f} MiB",
             "| restore | cache | s (median) | x torch | host peak MiB | GPU extra MiB | bit-identical |",
             "|---|---|---|---|---|---|---|"]
    for cache in ("warm", "cold"):
        rows = {k: [r for r in loads if r["cache"] == cache and r["kind"] == k] for k in
                ("torch.load", "deltackpt.load", "torch.load+load_state_dict", "deltackpt.restore")}
        for k, rs in rows.items():
            s = statistics.median(r["seconds"] for r in rs)
            a = statistics.median(r["seconds"] for r in rows[_ANCHOR[k]])
            lines.append(f"| {k} | {cache} | {s:.3f} | {s / a:.2f}x | {max(r['peak_host_MiB'] for r in rs):.0f} | "
                         f"{max(r['gpu_peak_extra_MiB'] for r in rs):.0f} | {all(r['bit_identical'] for r in rs)} |")
    lines.append("deltackpt.load onto the device, warm, by window per thread: " + ", ".join(
        f"{r['window_MiB']} MiB {r['seconds']:.3f} s (host peak {r['peak_host_MiB']:.0f} MiB)"
        for r in result["window_sweep"]))
    return "\n".join(lines)


def measure(folder: str, rounds: int, steps: int, quick: bool) -> dict:
    import torch

    from bench.common.scratch import compile_cache
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    with compile_cache():
        run = _Run(device, tiny=quick)
        run.train(3)   # kernels chosen, moments allocated
        floors = _floors(run)
        saves, repo_path, torch_file = _saves(run, folder, rounds, steps)
        restores = _restores(run, repo_path, torch_file, rounds)
        sweep = _window_sweep(run, repo_path, [1, 2] if quick else [4, 8, 16, 32])
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    return {"device": name, "cpus": os.cpu_count(), "torch": torch.__version__, "steps": steps,
            "rounds": rounds, "floors": floors, "saves": saves, "restores": restores, "window_sweep": sweep}


def run(a: argparse.Namespace) -> int:
    import torch

    from bench.common.record import record
    from bench.common.scratch import scratch
    if not a.quick and not torch.cuda.is_available():
        raise SystemExit("cuda_checkpoint needs a CUDA device (--quick runs on the CPU)")
    rounds, steps = (2, 2) if a.quick else (a.rounds, a.steps)
    with scratch("cuda-checkpoint-", parent=a.tmp) as folder:
        result = measure(folder, rounds, steps, a.quick)
        if a.quick:   # the recorder runs, into the scratch folder
            record("cuda_checkpoint", "quick", result, folder=folder)
    print(_summary(result))
    bad = [r for r in result["restores"] if not r["bit_identical"]]
    if bad:
        print(f"NOT bit-identical: {bad}")
        return 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if a.record:
        print("recorded in", record("cuda_checkpoint", a.record, result))
    return 0
