"""Real repositories built from the delta_sizes study's cached states, one per config ``delta_base``
(the topology: "parent" chain, "keyframe" star, and whatever else the library accepts), compared
on what each costs to write and to read back.

Per value: stored bytes per version (growth of the repository folder), bytes written per save
(every file the save created or rewrote), CPU and wall seconds per save, and for latest, latest~1 …
latest~K (K = keyframe_interval, or the oldest version): bytes the store fetched, bytes from disk,
seconds (cold page cache, fresh handle) and objects decoded per chunk.  Every load is checked
bit-identical to the cached state.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

from bench.common.states import tensors


def accepted_bases() -> tuple[str, ...]:
    """The delta_base values this deltackpt accepts."""
    from bench.common.repo_internals import delta_bases
    return delta_bases()


def _files(root: str) -> dict[str, tuple[int, int, int]]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            out[p] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def _written(before: dict, after: dict) -> int:
    """Bytes of the files a save created or replaced (a new inode, mtime or size)."""
    return sum(v[2] for p, v in after.items() if before.get(p) != v)


def _same(got: dict, cur: dict[str, np.ndarray]) -> bool:
    if set(got) != set(cur):
        return False
    return all(np.array_equal(got[k].numpy().reshape(-1).view(np.uint8), cur[k].reshape(-1).view(np.uint8))
               for k in cur)


def one_base(files: list[str], base: str, k: int | None, chunk_bytes: int, tmp: str) -> dict:
    """Save every cached version into a fresh repository with this ``delta_base``, then read back
    latest … latest~K cold.  A value the library refuses is returned as {"skipped": why}."""
    import torch

    import deltackpt
    from bench.common import coldcache
    from bench.common.repo_internals import config, objects_per_chunk, open_counted
    repo = os.path.join(tmp, f"repo-{base}")
    try:
        r = deltackpt.Repo.init(repo, delta_base=base, chunk_bytes=chunk_bytes,
                                **({"keyframe_interval": k} if k is not None else {}))
    except (ValueError, deltackpt.DeltackptError) as exc:
        return {"skipped": f"{type(exc).__name__}: {exc}"}
    k = config(r)["keyframe_interval"]
    saves = []
    tsizes = []
    try:
        for f in files:
            cur, tsize = tensors(f)
            tsizes.append(tsize)
            state = {n: torch.from_numpy(a) for n, a in cur.items()}
            before = _files(repo)
            c0, t0 = time.process_time(), time.perf_counter()
            v = r.save(state)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            after = _files(repo)
            saves.append({"stored": sum(x[2] for x in after.values()) - sum(x[2] for x in before.values()),
                          "written": _written(before, after), "written_lib": v.written_bytes, "cpu_s": cpu,
                          "wall_s": wall, "ratio_stored": None})
            saves[-1]["ratio_stored"] = saves[-1]["stored"] / tsize
    finally:
        r.close()
    reads = []
    n = len(files)
    for by in range(min(k, n - 1) + 1):
        cur, tsize = tensors(files[n - 1 - by])
        rev = "latest" if by == 0 else f"latest~{by}"
        holder: dict = {}

        def go():
            holder["r"], cs = open_counted(repo)
            out = holder["r"].load(rev)
            holder["read"] = cs.bytes_read   # before objects_per_chunk reads more
            return out

        dt, got, io = coldcache.cold(go, coldcache.files_under(repo))
        mean, mx = objects_per_chunk(holder["r"], rev)
        reads.append({"rev": rev, "store_read": holder["read"], "read_ratio": holder["read"] / tsize,
                      "io_read": io["io_read"], "cold_s": dt, "objects_mean": mean, "objects_max": mx,
                      "ok": _same(got, cur)})
        holder["r"].close()
        del got
    after = slice(1, None) if n > 1 else slice(None)
    med = lambda key: statistics.median(s[key] for s in saves[after])  # noqa: E731
    tmed = statistics.median(tsizes[after])
    return {"delta_base": base, "keyframe_interval": k, "saves": saves, "reads": reads,
            "stored_per_version": med("stored") / tmed,
            "written_per_save": med("written") / tmed,
            "cpu_per_save_s": med("cpu_s"), "wall_per_save_s": med("wall_s"),
            "total_stored": sum(s["stored"] for s in saves) / sum(tsizes)}


def compare_bases(files: list[str], bases: list[str] | None, k: int | None, chunk_bytes: int) -> dict:
    """``one_base`` for each value (default: every value the library accepts)."""
    out = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("DELTAS_TMP")) as tmp:
        for b in bases or accepted_bases():
            out[b] = one_base(files, b, k, chunk_bytes, tmp)
            if "skipped" in out[b]:
                print(f"  delta_base {b!r} skipped: {out[b]['skipped']}", flush=True)
    return out


def bases_table(name: str, res: dict) -> list[str]:
    """Markdown rows: one per delta_base, ratios against torch.save of the same version."""
    rows = []
    for b, x in res.items():
        if "skipped" in x:
            rows.append(f"| {name} | {b} | skipped: {x['skipped']} |")
            continue
        reads = " / ".join(f"{r['read_ratio']:.2f}" for r in x["reads"])
        objs = " / ".join(f"{r['objects_mean']:.2f}" for r in x["reads"])
        secs = " / ".join(f"{r['cold_s']:.2f}" for r in x["reads"])
        ok = "yes" if all(r["ok"] for r in x["reads"]) else "NO"
        rows.append(f"| {name} | {b} | {x['stored_per_version']:.3f} | {x['total_stored']:.3f} | "
                    f"{x['written_per_save']:.3f} | "
                    f"{x['cpu_per_save_s']:.2f} | {reads} | {objs} | {secs} | {ok} |")
    return rows


BASES_HEADER = ["| workload | delta_base | stored / version | repository / all versions | "
                "written / save | CPU s / save | read, latest / ~1 / … / ~K (× torch.save) | objects per chunk, "
                "same order | cold s, same order | bit-identical |", "|---|---|---|---|---|---|---|---|---|---|"]


def restore_times(files: list[str], k: int, chunk_bytes: int, delta_base: str = "parent",
                  rounds: int = 2) -> list[dict]:
    """Save every version into a real repository with keyframe interval k (and ``delta_base``);
    time loading each one from a fresh handle (the median of ``rounds``, versions interleaved)."""
    import torch

    import deltackpt
    from bench.common.repo_internals import max_depth
    res = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("DELTAS_TMP")) as tmp:
        repo = os.path.join(tmp, "repo")
        w = deltackpt.Repo.init(repo, keyframe_interval=k, chunk_bytes=chunk_bytes, delta_base=delta_base)
        vids = []
        try:
            for f in files:
                cur, tsize = tensors(f)
                state = {n: torch.from_numpy(a) for n, a in cur.items()}
                t0 = time.perf_counter()
                v = w.save(state)
                vids.append((v, time.perf_counter() - t0, tsize))
        finally:
            w.close()
        r = deltackpt.Repo(repo)
        try:
            depths = {v.id: max_depth(r, v.id) for v, _, _ in vids}
        finally:
            r.close()
        times: dict = {v.id: [] for v, _, _ in vids}
        for _ in range(rounds):
            for (v, _save_s, _tsize) in vids:
                r = deltackpt.Repo(repo)   # a fresh handle, as a new process: nothing decoded in memory
                try:
                    t0 = time.perf_counter()
                    r.load(v.id)
                    times[v.id].append(time.perf_counter() - t0)
                finally:
                    r.close()
        for (v, save_s, tsize) in vids:
            res.append({"version": v.id[:10], "depth": depths[v.id], "load_s": statistics.median(times[v.id]),
                        "save_s": save_s, "written_ratio": v.written_bytes / tsize})
    return res
