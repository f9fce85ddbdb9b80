"""Live rollback and parallel decode, measured once (issue 17 items 2 and 3).

1. Pack bytes read by ``restore(model, repo, "latest~1", optimizer=opt)`` into the live model and
   AdamW (at ``latest``), against the same restore into a fresh model and optimizer (a cold read of
   the target's chains), and a roll-forward back to ``latest``; on whatever topology the saver
   writes (forward-chained today: the rollback undoes the live chunks' deltas).
2. Restore throughput of a ~200 MB state (one keyframe version, a fresh model: nothing to reuse)
   with each ``threads=`` value given, best of ``--repeat``; then the same restore into the model
   that now holds it (every chunk hashed, nothing read: the live check's own cost).

    PYTHONPATH=. python bench/live_rollback.py [--mb 200] [--threads 1,2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict

import torch

import deltackpt
from deltackpt.repo import live
from deltackpt.store import CountingStore, LocalStore


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10))


def rollback_bytes(versions: int = 5) -> dict:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = tempfile.mkdtemp(prefix="live-bench-") + "/repo"
    for step in range(versions):
        x = torch.randn(128, 256)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (128,))).backward()
        opt.step()
        deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path, step=step)
    store = CountingStore(LocalStore(path))
    repo = deltackpt.Repo(store)
    raw = sum(t.nbytes for t in repo.core.manifest(repo.core.resolve("latest")).tensors)

    def run(m, o, rev):
        repo.core.refresh_index()
        store.reset()
        live.stats.reset()
        deltackpt.restore(m, repo, rev, optimizer=o)
        return store.bytes_read_under("packs/"), asdict(live.stats)

    out = {"state_bytes": raw}
    out["live_rollback_1"] = run(model, opt, "latest~1")
    out["live_roll_forward_1"] = run(model, opt, "latest")
    torch.manual_seed(1)
    cold = _mlp()
    cold_opt = torch.optim.AdamW(cold.parameters(), lr=1e-3)
    cold(torch.randn(4, 256)).sum().backward()
    cold_opt.step()  # its state tensors exist but match nothing: every chunk is read whole
    out["cold_restore_latest~1"] = run(cold, cold_opt, "latest~1")
    return out


def throughput(mb: int, threads: list[int], repeat: int) -> dict:
    n = mb * (1 << 20) // 4 // 4096
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(max(1, n // 4096))])
    path = tempfile.mkdtemp(prefix="live-bench-") + "/repo"
    deltackpt.save(model, path)
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    fresh = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(len(model))])
    out = {"state_mb": nbytes / 2**20}
    for t in threads:
        best = float("inf")
        for _ in range(repeat):
            with torch.no_grad():
                for p in fresh.parameters():
                    p.zero_()  # not the saved bytes: a full read every time
            t0 = time.perf_counter()
            deltackpt.restore(fresh, path, threads=t)
            best = min(best, time.perf_counter() - t0)
        out[f"threads={t}"] = f"{best:.3f} s, {nbytes / best / 2**20:.0f} MiB/s"
    t0 = time.perf_counter()
    deltackpt.restore(fresh, path)  # already there: every chunk hashed, none read
    out["already_there"] = f"{time.perf_counter() - t0:.3f} s"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(rollback_bytes())
    print(throughput(a.mb, [int(x) for x in a.threads.split(",")], a.repeat))


if __name__ == "__main__":
    main()
