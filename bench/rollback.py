"""Rollback rows for deltackpt (issue 17): cold loads of latest, latest~1 and latest~K, and live
rollbacks by 1 and 2 versions into the model (and optimizer) that holds the latest version.

Every row opens a fresh repository handle over a CountingStore (what a restarted process sees: no
delta cache, no index in memory), drops the repository's files from the page cache first, and
reports the bytes the store fetched and the bytes that reached the disk (/proc/self/io), and the
objects decoded per chunk.  Every row is checked bit-identical to the version it names.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import coldcache
from bench.measure import digests, tensor_bytes


def open_counted(path: str):
    """A fresh Repo over a CountingStore of the repository at ``path``, and that store."""
    import deltackpt
    from deltackpt.store import LocalStore
    from deltackpt.store.counting import CountingStore
    cs = CountingStore(LocalStore(path))
    return deltackpt.Repo(cs), cs


def objects_per_chunk(core: Any, vid: str) -> tuple[float, int]:
    """Mean and max over the version's chunk references of the objects a read decodes: the chunk's
    object and every base it names, followed through the index whatever the topology."""
    core.index.refresh()
    counts = []
    for b in core.manifest(vid).blobs:
        for c in b.chunks:
            n, cid = 0, c.chunk_id
            while cid is not None:
                n += 1
                cid = core.index.entry(cid)[1].base
            counts.append(n)
    return (statistics.mean(counts), max(counts)) if counts else (0.0, 0)


def cold_load(path: str, rev: str, expected: dict[str, str]) -> dict:
    """``Repo(store).load(rev)`` on a fresh counting handle with the repository out of the page cache."""
    files = coldcache.files_under(path)
    holder: dict = {}

    def go():
        r, cs = open_counted(path)
        holder["repo"], holder["cs"] = r, cs
        out = r.load(rev)
        holder["read"], holder["gets"] = cs.bytes_read, cs.gets   # before anything below reads more
        return out

    dt, got, io = coldcache.cold(go, files)
    r = holder["repo"]
    vid = r.core.resolve(rev)
    mean, mx = objects_per_chunk(r.core, vid)
    ok = digests(got) == expected
    r.close()
    return {"s": dt, "store_read": holder["read"], "gets": holder["gets"], **io, "objects_mean": mean,
            "objects_max": mx, "ok": ok}


def _live_digest(live: dict) -> dict[str, str]:
    state = {"model": live["model"].state_dict()}
    if live.get("optimizer") is not None:
        state["optimizer"] = live["optimizer"].state_dict()
    return digests(state)


def _part(expected: dict[str, str], live: dict) -> dict[str, str]:
    keep = ("model/", "optimizer/") if live.get("optimizer") is not None else ("model/",)
    return {k: v for k, v in expected.items() if k.startswith(keep)}


def live_rollback(path: str, by: int, live: dict, digs: list[dict[str, str]]) -> dict:
    """The live model (and optimizer) holds the latest version; time ``deltackpt.restore(model,
    repo, "latest~by", optimizer=...)`` cold, and check every live tensor against that version."""
    import deltackpt
    opt = live.get("optimizer")
    if _live_digest(live) != _part(digs[-1], live):   # an earlier row rolled it back: untimed, checked
        r, _ = open_counted(path)
        deltackpt.restore(live["model"], r, "latest", optimizer=opt)
        r.close()
        if _live_digest(live) != _part(digs[-1], live):
            return {"ok": False, "s": float("nan"), "store_read": 0, "io_read": 0, "resident_after_drop": 0,
                    "error": "could not put the latest version back into the live model"}
    files = coldcache.files_under(path)
    holder: dict = {}

    def go():
        r, cs = open_counted(path)
        holder["repo"], holder["cs"] = r, cs
        v = deltackpt.restore(live["model"], r, f"latest~{by}", optimizer=opt)
        holder["read"], holder["gets"] = cs.bytes_read, cs.gets
        return v

    dt, v, io = coldcache.cold(go, files)
    r = holder["repo"]
    mean, mx = objects_per_chunk(r.core, v.id)
    r.close()
    ok = _live_digest(live) == _part(digs[-1 - by], live)
    return {"s": dt, "store_read": holder["read"], "gets": holder["gets"], **io, "objects_mean": mean,
            "objects_max": mx, "ok": ok}


def _repeat(fn, repeats: int) -> dict:
    """``fn()`` ``repeats`` times: the median seconds, every run's seconds, and ok only if all were."""
    runs = [fn() for _ in range(repeats)]
    row = dict(runs[len(runs) // 2])
    row["s_all"] = [x["s"] for x in runs]
    row["s"] = statistics.median(row["s_all"])
    row["ok"] = all(x["ok"] for x in runs)
    return row


def rows(path: str, digs: list[dict[str, str]], live: dict | None, ts_bytes: list[int],
         ts_cold: list[float], repeats: int = 1) -> dict:
    """Every rollback row of one workload's repository (``digs``: each version's digests, oldest
    first; ``ts_bytes`` / ``ts_cold``: torch.save file size and cold torch.load seconds per version;
    each row runs ``repeats`` times, its seconds are the median)."""
    import deltackpt
    r = deltackpt.Repo(path)
    k = r.core.config.keyframe_interval
    base = r.core.config.delta_base
    n = len(digs)
    out: list[dict] = []
    t0 = time.perf_counter()
    deep = min(k, n - 1)
    for by in sorted({0, 1, deep}):
        if by >= n:
            continue
        rev = "latest" if by == 0 else f"latest~{by}"
        row = _repeat(lambda: cold_load(path, rev, digs[n - 1 - by]), repeats)
        label = f"load {rev}" + (f" (K={k})" if by == k else " (oldest)" if by == deep and by > 1 else "")
        out.append({"row": label, "by": by, "ts_bytes": ts_bytes[n - 1 - by], "ts_cold_s": ts_cold[n - 1 - by], **row})
    if live:
        lb = tensor_bytes({"model": live["model"].state_dict(),
                           **({"optimizer": live["optimizer"].state_dict()} if live.get("optimizer") else {})})
        for by in (1, 2):
            if by >= n:
                continue
            row = _repeat(lambda: live_rollback(path, by, live, digs), repeats)
            label = f"live rollback by {by}" + (" (model + optimizer)" if live.get("optimizer") else " (model)")
            out.append({"row": label, "by": by, "live_bytes": lb, "ts_bytes": ts_bytes[n - 1 - by],
                        "ts_cold_s": ts_cold[n - 1 - by], **row})
    return {"keyframe_interval": k, "delta_base": base, "versions": n, "rows": out, "wall_s": time.perf_counter() - t0}
