"""Rollback for the comparison: deltackpt's rows (cold loads of latest, latest~1 and latest~K, and
live rollbacks by 1 and 2 versions into the model, and optimizer, that holds the latest version),
and the live rollback by one version for every system that can do one (torch.save files, DCP,
deltackpt), with the memory it takes on top of the live state.

Every row opens a fresh repository handle over a CountingStore (what a restarted process sees: no
delta cache, no index in memory), drops the repository's files from the page cache first, and
reports the bytes the store fetched and the bytes that reached the disk (/proc/self/io), and the
objects decoded per chunk.  Every row is checked bit-identical to the version it names.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from bench.common import coldcache
from bench.common.measure import digests, tensor_bytes
from bench.common.memory import PeakAnon
from bench.common.repo_internals import config, objects_per_chunk, open_counted


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
    mean, mx = objects_per_chunk(r, rev)
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
    mean, mx = objects_per_chunk(r, v.id)
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
    r, _ = open_counted(path)   # its own handle: closing it leaves the saving system's alone
    cfg = config(r)
    r.close()
    k, base = cfg["keyframe_interval"], cfg["delta_base"]
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


def _torch_file(base: str, v: int) -> str:
    return os.path.join(base, "torch.save+fsync" if os.path.isdir(os.path.join(base, "torch.save+fsync")) else "torch.save",
                        f"v{v}", "ckpt.pt")


def _put_back(live: dict, base: str, v: int) -> None:
    """Load version ``v`` into the live model (and optimizer), untimed, from its torch.save file."""
    st = torch.load(_torch_file(base, v), weights_only=True)
    live["model"].load_state_dict(st["model"])
    if live.get("optimizer") is not None:
        live["optimizer"].load_state_dict(st["optimizer"])


def _live_state(live: dict) -> dict:
    state = {"model": live["model"].state_dict()}
    if live.get("optimizer") is not None:
        state["optimizer"] = live["optimizer"].state_dict()
    return state


def every_system(syss, base: str, live: dict, digs: list[dict[str, str]], folder) -> dict:
    """The live rollback by one version, cold, for each system that can do one: a ``torch.save``
    file (``torch.load`` + ``load_state_dict``), DCP (``dcp.load`` into the live tensors) and
    deltackpt (``deltackpt.restore`` on a fresh handle).  Per system: seconds, the peak anonymous
    memory above the live state's while it runs, bytes from disk, and whether every live tensor
    then equals the version before the latest.  ``folder(system, v)``: where it keeps version v."""
    import deltackpt
    from bench.common.systems import DCP
    n = len(digs)
    if n < 2 or not any(s.name.startswith("torch.save") for s in syss):
        return {}
    names = [s.name for s in syss]
    ts_name = "torch.save+fsync" if "torch.save+fsync" in names else "torch.save"
    out: dict = {}
    for s in syss:
        if s.name not in (ts_name, "dcp", "deltackpt"):
            continue
        _put_back(live, base, n - 1)
        d = folder(s, n - 2)
        opt = live.get("optimizer")

        def go():
            if s.name == "deltackpt":
                r, _ = open_counted(d)
                try:
                    deltackpt.restore(live["model"], r, "latest~1", optimizer=opt)
                finally:
                    r.close()
            elif s.name == "dcp":
                DCP().load_into(d, _live_state(live))   # in place: the state dicts hold the live tensors
            else:
                st = torch.load(os.path.join(d, "ckpt.pt"), weights_only=True)
                live["model"].load_state_dict(st["model"])
                if opt is not None:
                    opt.load_state_dict(st["optimizer"])
                del st
        with PeakAnon() as mem:
            dt, _, io = coldcache.cold(go, coldcache.files_under(d))
        out[s.name] = {"s": dt, "extra_bytes": mem.extra, "io_read": io["io_read"],
                       "ok": _live_digest(live) == _part(digs[n - 2], live)}
    _put_back(live, base, n - 1)
    return out
