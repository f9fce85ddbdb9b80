"""The comparison's child processes, each a fresh Python process that prints one JSON line:

    python -m bench.studies.compare_children rss-save SYSTEM STATE.pt DIR   # peak RSS of a save
    python -m bench.studies.compare_children rss-load SYSTEM STATE.pt DIR   # peak RSS of a load
    python -m bench.studies.compare_children load [--cold] SYSTEM DIR [SYSTEM DIR ...]   # newest version, timed

``rss-*`` print {"base": RSS MiB before the operation, "peak": the process's high-water mark MiB};
``rss-save`` first loads the state from a torch.save file (that memory is in "base"), then saves it
into a fresh DIR.  ``load`` is the restart after a crash: the systems' packages are imported
before the clock, then SYSTEM's loader reads the newest version in DIR (what that first call
imports, it imports inside the clock) (``--cold``: its files dropped from the page cache
first); it prints {SYSTEM: {"s", "io_read": bytes from disk, "resident_after_drop", "digests"}} so
that the parent checks the restore bit-identical.  Several pairs load one after the other in the
same process (only the first is a fresh process's load: what a quick run accepts to save children).
"""

from __future__ import annotations

import json
import sys

import psutil
import torch

from bench.common import coldcache
from bench.common.measure import digests
from bench.common.memory import vm_hwm
from bench.common.systems import systems


def _system(name: str):
    return {s.name: s for s in systems()}[name]


def rss(mode: str, name: str, state_path: str, d: str) -> dict:
    sysm = _system(name)
    state = torch.load(state_path, weights_only=True) if mode == "rss-save" else None
    base = psutil.Process().memory_info().rss / 2**20
    try:
        if mode == "rss-save":
            sysm.save(state, d)
        else:
            sysm.load(d)
    finally:
        sysm.close()
    return {"base": base, "peak": vm_hwm() / 2**20}


def load(name: str, d: str, cold: bool) -> dict:
    sysm = _system(name)
    try:
        # cold() drops the files first; with no files it drops nothing and times the same way
        dt, got, io = coldcache.cold(sysm.load, coldcache.files_under(d) if cold else [], d)
    finally:
        sysm.close()
    return {"s": dt, **io, "digests": digests(got)}


def main(argv: list[str]) -> None:
    if argv[0].startswith("rss"):
        torch.set_num_threads(1)
    if argv[0] in ("rss-save", "rss-load"):
        out = rss(argv[0], argv[1], argv[2], argv[3])
    elif argv[0] == "load":
        cold = "--cold" in argv
        pairs = [x for x in argv[1:] if x != "--cold"]
        out = {name: load(name, d, cold) for name, d in zip(pairs[::2], pairs[1::2])}
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
