"""Restore throughput of the latest version with N read threads (DELTACKPT_READ_THREADS=N).

Each thread count runs in its own process, so the read pool is built from the variable set for it:
the repository is dropped from the page cache, the latest version is loaded (cold) on a fresh
handle, then loaded again on another fresh handle (warm).  Both loads are checked bit-identical.

    python -m bench.studies.compare_read_threads REPO THREADS    # child: prints one JSON line
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = "DELTACKPT_READ_THREADS"


def library_reads_env() -> bool:
    """Whether this deltackpt reads DELTACKPT_READ_THREADS at all (else both rows use its default pool)."""
    import deltackpt
    root = os.path.dirname(deltackpt.__file__)
    for dirpath, _, names in os.walk(root):
        for n in names:
            if n.endswith(".py"):
                with open(os.path.join(dirpath, n), encoding="utf-8") as f:
                    if ENV in f.read():
                        return True
    return False


def measure(repo: str, threads: list[int], expected: dict[str, str], logical: int, repeats: int = 1) -> dict:
    """Run the child for each thread count, ``repeats`` rounds interleaved (1, 2, 1, 2, ...: drift
    in the machine's load hits every count alike); a row keeps the median round's seconds, and
    MB/s is the version's tensor bytes / seconds."""
    env_path = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    runs: dict[int, list[dict]] = {n: [] for n in threads}
    for _ in range(repeats):
        for n in threads:
            runs[n].append(_run(repo, n, env_path, expected, logical))
    rows = []
    for n in threads:
        ok = [r for r in runs[n] if r["ok"]]
        if len(ok) < len(runs[n]) or not ok:
            rows.append({"threads": n, "ok": False})
            continue
        ok.sort(key=lambda r: r["cold_s"])
        row = dict(ok[len(ok) // 2])
        row["cold_s_all"] = [r["cold_s"] for r in runs[n]]
        row["warm_s_all"] = [r["warm_s"] for r in runs[n]]
        rows.append(row)
    return {"library_reads_env": library_reads_env(), "repeats": repeats, "rows": rows}


def _run(repo: str, n: int, env_path: str, expected: dict[str, str], logical: int) -> dict:
    """One child process with DELTACKPT_READ_THREADS=n."""
    env = dict(os.environ, PYTHONPATH=env_path, **{ENV: str(n)})
    p = subprocess.run([sys.executable, "-m", "bench.studies.compare_read_threads", repo, str(n)], capture_output=True,
                       text=True, env=env, timeout=600)
    if p.returncode != 0:
        print(f"  read_threads {n} failed: {p.stderr[-500:]}", file=sys.stderr)
        return {"threads": n, "ok": False}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["ok"] = r.pop("digests") == [expected, expected]
    r["cold_MBps"] = logical / r["cold_s"] / 1e6
    r["warm_MBps"] = logical / r["warm_s"] / 1e6
    return r


def _child(repo: str, threads: int) -> None:
    import time

    from bench.common import coldcache
    from bench.common.measure import digests
    from bench.common.repo_internals import open_counted
    out: dict = {"threads": threads, "env": os.environ.get(ENV), "digests": []}
    r, _ = open_counted(repo)   # untimed: the first load imports the read path's modules
    r.load("latest")
    r.close()
    for label in ("cold", "warm"):
        files = coldcache.files_under(repo) if label == "cold" else []
        coldcache.drop(files)
        r0 = coldcache.io_read_bytes()
        t0 = time.perf_counter()
        r, cs = open_counted(repo)
        got = r.load("latest")
        out[f"{label}_s"] = time.perf_counter() - t0
        out[f"{label}_io_read"] = coldcache.io_read_bytes() - r0
        out[f"{label}_store_read"] = cs.bytes_read
        out["digests"].append(digests(got))
        r.close()
        del got
    print(json.dumps(out))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
