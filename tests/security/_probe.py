"""Runs one reader command against a repository in this (child) process and prints, as the last line
of stdout, ``@@ {"outcome": ..., "error": type name, "message": ..., "ms": ..., "rss_mib": ...}``.

Hostile repositories are probed in a child so that a segfault, a hang or a memory blow-up fails the
test (the parent sees a signal, a timeout or the child's own peak RSS) instead of killing pytest.

    python -m tests.security._probe MODE REPO [ARGS...]
    MODE: cli (ARGS = a deltackpt command line without --repo), load, resume, verify, rebuild,
          save (ARGS: an optional tag)
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import time


def _run(mode: str, repo: str, args: list[str]) -> dict:
    import deltackpt
    if mode == "cli":
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            from deltackpt.cli.main import main  # imported here: render binds sys.stdout at import
            rc = main([*args, "--repo", repo])
        return {"outcome": "rc", "rc": rc, "output": out.getvalue()[-2000:]}
    if mode == "load":
        state = deltackpt.load(repo, *args)
        return {"outcome": "ok", "keys": sorted(map(str, state)) if isinstance(state, dict) else None}
    if mode == "resume":
        info = deltackpt.resume(repo, restore_rng=False)
        return {"outcome": "ok", "version": info.version.id if info else None}
    if mode == "verify":
        report = deltackpt.Repo(repo).verify()
        return {"outcome": "ok", "ok": report.ok, "errors": [[p.object, p.problem] for p in report.errors]}
    if mode == "save":
        import torch
        v = deltackpt.save({"w": torch.ones(8), "step": 7}, repo, step=7, **({"tag": args[0]} if args else {}))
        return {"outcome": "ok", "version": v.id}
    if mode == "rebuild":
        rep = deltackpt.Repo(repo).rebuild_index()
        return {"outcome": "ok", "skipped": rep.packs_skipped, "packs": rep.packs_indexed}
    raise SystemExit(f"unknown mode {mode}")


def _peak_rss_kib() -> int:
    """This process's peak RSS.  VmHWM belongs to the address space made by exec; ru_maxrss on
    Linux also keeps the parent's RSS at fork, so a big pytest parent would hide a child's growth."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    mode, repo, *args = sys.argv[1:]
    t0 = time.perf_counter()
    try:
        result = _run(mode, repo, args)
    except Exception as exc:  # reported, typed or not: the parent decides
        from deltackpt.errors import DeltackptError
        result = {"outcome": "error", "error": type(exc).__name__, "typed": isinstance(exc, DeltackptError),
                  "message": str(exc)[:2000]}
    result["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    result["rss_mib"] = round(_peak_rss_kib() / 1024, 1)
    print("@@ " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
