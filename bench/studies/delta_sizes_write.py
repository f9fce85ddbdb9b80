"""The write path on real repositories (the delta_sizes study's ``write`` section): what each save
writes, what deltification writes later, what the repository keeps per version once deltified, and
what the newest version costs to read, with and without a ``keep_last=3`` retention.  Every ratio is against the ``torch.save`` bytes of
the same version.

    python -m bench delta_sizes --workloads full,frozen,recsys,gpt,cnn --versions 10 \\
        --cache /work/cache --sections write --record write_path

Each run saves the cached versions into a fresh repository through one handle (the repository's
size right after a save returns is what that save left), then:

* **as saved**: bytes written per later save (every file the save created or replaced), CPU per
  save, and the newest version read cold from a fresh handle (bytes fetched, objects decoded per
  chunk, seconds);
* **deltified**: ``Repo.deltify()`` once (the default, lag 1: format 2 also kept only the newest
  version whole), its bytes written and CPU, the repository's size per version and the reads of
  latest … latest~K; and, on a copy, ``deltify(lag=2)`` (the previous default), its size;
* **after every save**: a fresh repository where each save is followed by ``deltify()``: bytes
  written by saves and by deltify, and the size at the end;
* **keep_last=3**: a fresh repository where every save is followed by ``gc(keep_last=3)`` and a
  deltify behind that window, as a Checkpointer with that retention runs them: bytes written by
  saves, gc and deltify.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from bench.common.repo_internals import config, objects_per_chunk, open_counted
from bench.common.states import tensors
from bench.studies.delta_sizes_bases import _files, _same, _written


def _save_all(repo, files: list[str], *, after=None) -> tuple[list[dict], list[int]]:
    import torch

    repo_path = repo.location
    saves, tsizes = [], []
    for f in files:
        cur, tsize = tensors(f)
        tsizes.append(tsize)
        state = {n: torch.from_numpy(a) for n, a in cur.items()}
        before = _files(repo_path)
        c0, t0 = time.process_time(), time.perf_counter()
        repo.save(state)
        row = {"written": 0, "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0}
        row["written"] = _written(before, _files(repo_path))
        if after is None:
            row["anchor_cpu_s"] = _torch_save_cpu(state, repo_path)
        if after is not None:
            before = _files(repo_path)
            c0 = time.process_time()
            extra = after()
            row.update(extra)
            row["maintenance_written"] = _written(before, _files(repo_path))
            row["maintenance_cpu_s"] = time.process_time() - c0
        saves.append(row)
    return saves, tsizes


def _torch_save_cpu(state: dict, beside: str) -> float:
    """CPU seconds of torch.save + fsync of the same state (the anchor of "CPU per save")."""
    import torch
    path = beside.rstrip("/") + ".anchor.pt"
    c0 = time.process_time()
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    took = time.process_time() - c0
    os.unlink(path)
    return took


def _read(repo_path: str, rev: str, files: list[str], index: int) -> dict:
    from bench.common import coldcache
    cur, tsize = tensors(files[index])
    holder: dict = {}

    def go():
        holder["r"], cs = open_counted(repo_path)
        out = holder["r"].load(rev)
        holder["read"] = cs.bytes_read
        return out

    dt, got, _io = coldcache.cold(go, coldcache.files_under(repo_path))
    mean, mx = objects_per_chunk(holder["r"], rev)
    holder["r"].close()
    return {"rev": rev, "read_ratio": holder["read"] / tsize, "objects_mean": mean, "objects_max": mx,
            "cold_s": dt, "ok": _same(got, cur)}


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def measure(files: list[str]) -> dict:
    """The runs above for one workload's cached versions.  Each repository is written through one
    handle, closed before it is read back (a fresh handle: nothing decoded in memory)."""
    import deltackpt
    n = len(files)
    out: dict = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("DELTAS_TMP")) as tmp:
        path = os.path.join(tmp, "repo")
        repo = deltackpt.Repo.init(path)
        try:
            saves, tsizes = _save_all(repo, files)
        finally:
            repo.close()
        later = saves[1:] or saves
        tlater = tsizes[1:] or tsizes
        out["written_per_save"] = statistics.median(s["written"] / t for s, t in zip(later, tlater))
        out["written_per_save_mean"] = statistics.mean(s["written"] / t for s, t in zip(later, tlater))
        out["cpu_per_save_s"] = statistics.median(s["cpu_s"] for s in later)
        out["cpu_per_save_ratio"] = statistics.median(s["cpu_s"] / max(s["anchor_cpu_s"], 1e-6) for s in later)
        out["wall_per_save_s"] = statistics.median(s["wall_s"] for s in later)
        out["saves"] = saves
        out["tsize_total"] = sum(tsizes)
        out["latest_as_saved"] = _read(path, "latest", files, n - 1)
        out["stored_as_saved"] = _du(path) / sum(tsizes)
        two = os.path.join(tmp, "lag2")   # the previous default, latest~1 left whole as well, on a copy
        shutil.copytree(path, two)
        out["deltify_lag2"] = _with(two, lambda r: r.deltify(lag=2).to_json())
        out["stored_deltified_lag2"] = _du(two) / sum(tsizes)
        shutil.rmtree(two)
        before = _files(path)
        c0 = time.process_time()
        report = _with(path, lambda r: r.deltify())
        out["deltify"] = {**report.to_json(), "cpu_s": time.process_time() - c0,
                          "written": _written(before, _files(path))}
        out["stored_deltified"] = _du(path) / sum(tsizes)
        out["total_written"] = (sum(s["written"] for s in saves) + out["deltify"]["written"]) / sum(tsizes)
        k = _with(path, lambda r: config(r)["keyframe_interval"])
        out["reads"] = [_read(path, "latest" if b == 0 else f"latest~{b}", files, n - 1 - b)
                        for b in range(min(k, n - 1) + 1)]

        steps = deltackpt.Repo.init(os.path.join(tmp, "steps"))   # deltify after every save
        try:
            ssaves, stsizes = _save_all(steps, files, after=lambda: {"deltified": steps.deltify().chunks})
        finally:
            steps.close()
        out["after_every_save"] = {
            "saves_written": sum(s["written"] for s in ssaves) / sum(stsizes),
            "deltify_written": sum(s["maintenance_written"] for s in ssaves) / sum(stsizes),
            "deltify_cpu_s": sum(s["maintenance_cpu_s"] for s in ssaves),
            "stored": _du(steps.location) / sum(stsizes),
            "latest": _read(steps.location, "latest", files, n - 1)}
        shutil.rmtree(steps.location)

        kept = deltackpt.Repo.init(os.path.join(tmp, "keep3"))

        def maintain() -> dict:
            g = kept.gc(keep_last=3, grace_seconds=0)
            d = kept.deltify(lag=3)
            return {"gc_rebased": g.chunks_rebased, "gc_deltified": g.chunks_deltified, "deltified": d.chunks}

        try:
            ksaves, ktsizes = _save_all(kept, files, after=maintain)
        finally:
            kept.close()
        out["keep3"] = {"saves_written": sum(s["written"] for s in ksaves) / sum(ktsizes),
                        "maintenance_written": sum(s["maintenance_written"] for s in ksaves) / sum(ktsizes),
                        "deltified_chunks": sum(s["deltified"] + s["gc_deltified"] for s in ksaves),
                        "rebased_chunks": sum(s["gc_rebased"] for s in ksaves),
                        "latest": _read(kept.location, "latest", files, n - 1)}
    return out


def _with(path: str, fn):
    """``fn(repo)`` on a handle of its own, closed after."""
    import deltackpt
    r = deltackpt.Repo(path)
    try:
        return fn(r)
    finally:
        r.close()


HEADER = ["| workload | written / save, median (mean) | CPU s / save (/ torch.save+fsync) | latest as saved: read / objects per chunk / "
          "cold s | deltify: written / all versions (chunks) | repository / all versions: as saved → deltified (lag 2) | "
          "total written / all versions | deltify after every save: repository / total written | "
          "latest~1 … ~K read (objects) | keep_last=3: saves / maintenance written, "
          "chunks deltified | bit-identical |", "|---|---|---|---|---|---|---|---|---|---|---|"]


def rows(name: str, x: dict) -> list[str]:
    ls = x["latest_as_saved"]
    older = " / ".join(f"{r['read_ratio']:.2f} ({r['objects_mean']:.2f})" for r in x["reads"][1:])
    k3 = x["keep3"]
    ev = x["after_every_save"]
    ok = all(r["ok"] for r in x["reads"]) and ls["ok"] and k3["latest"]["ok"] and ev["latest"]["ok"]
    return [f"| {name} | {x['written_per_save']:.3f} ({x['written_per_save_mean']:.3f}) | {x['cpu_per_save_s']:.2f} ({x.get('cpu_per_save_ratio', float('nan')):.1f}x) | "
            f"{ls['read_ratio']:.2f} / {ls['objects_mean']:.2f} / {ls['cold_s']:.2f} | "
            f"{x['deltify']['written'] / x['tsize_total']:.3f} ({x['deltify']['chunks']} chunks) | "
            f"{x['stored_as_saved']:.3f} → {x['stored_deltified']:.3f} ({x.get('stored_deltified_lag2', float('nan')):.3f}) | {x['total_written']:.3f} | "
            f"{ev['stored']:.3f} / {ev['saves_written'] + ev['deltify_written']:.3f} | {older} | "
            f"{k3['saves_written']:.3f} / {k3['maintenance_written']:.3f}, {k3['deltified_chunks']} | "
            f"{'yes' if ok else 'NO'} |"]
