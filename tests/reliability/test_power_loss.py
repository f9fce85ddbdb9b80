"""Item 3 of issue 5: simulated power loss under saves, a tag and gc (tests/reliability/pagecache.py).

The workload runs in a child (child.py ``powercut``) over the page-cache store; at the cut the child
rewrites the directory as a power cut could leave it and exits, so its locks name a dead process,
as after a reboot.  The oracle then runs here."""

from __future__ import annotations

import json
import random
import time

import pytest
from harness import FULL, oracle, record

pytestmark = pytest.mark.reliability


def _one(zygote, path: str, cut: int | None, seed: int, revert_only: list | None = None) -> dict:
    c = zygote.run("powercut", path, cut=cut, seed=seed, revert_only=revert_only)
    lines = c.lines()
    if cut is None:
        assert "DONE" in lines, c.text()
        return {"steps": int(next(ln.split()[1] for ln in lines if ln.startswith("STEPS "))),
                "gc_from": int(next(ln.split()[2] for ln in lines if ln.startswith("PHASE gc ")))}
    crash = [ln for ln in lines if ln.startswith("CRASH ")]
    assert crash, f"power cut at step {cut} did not happen:\n{c.text()}"
    committed = c.committed()
    phases = {ln.split()[1] for ln in lines if ln.startswith("PHASE ")}
    must = {v for v, _ in committed}
    if "gc" in phases:
        must = {v for v, _ in committed[-2:]} | {committed[0][0]}
    if "tagged" in phases:
        from deltackpt.repo.repository import Repository
        assert Repository(path).tags().get("first") == committed[0][0], f"cut {cut}: a returned tag() was lost"
    oracle(path, expected=c.attempts(), committed=committed, must_exist=must)
    return json.loads(crash[0][6:])


def test_power_cut_at_every_step(zygote, tmp_path):
    """A power cut at any step of saves, a tag and a gc, with unsynced writes kept, dropped or garbled
    and unsynced directory changes reverted at random, loses nothing that returned and leaves a
    repository that verifies, saves and collects (every step and 3 seeds in full mode, a sample in CI)."""
    t0 = time.monotonic()
    total = _one(zygote, str(tmp_path / "count"), None, 0)["steps"]
    cuts = list(range(1, total + 1))
    seeds = (0, 1, 2) if FULL else (0,)
    if not FULL:
        cuts = sorted(random.Random(3).sample(cuts, 10))
    agg: dict[str, int] = {}
    n = 0
    for seed in seeds:
        for cut in cuts:
            n += 1
            stats = _one(zygote, str(tmp_path / f"s{seed}-c{cut}"), cut, seed * 100003 + cut)
            for k, v in stats.items():
                agg[k] = agg.get(k, 0) + v
    record("power-loss", points=n, steps=total, seeds=len(seeds), **agg, lost=0, torn=0, wrong=0,
           seconds=round(time.monotonic() - t0, 1))


def test_power_cut_during_gc_never_resurrects_a_broken_version(zygote, tmp_path):
    """Regression: gc deleted manifests without syncing their folder before deleting the chunks they
    needed, so a power cut could bring back a removed manifest whose packs were gone (a visible,
    unrestorable version).  Every cut during gc, reverting unsynced changes in manifests/ only."""
    count = _one(zygote, str(tmp_path / "count"), None, 0)
    for cut in range(count["gc_from"] + 1, count["steps"] + 1):
        _one(zygote, str(tmp_path / f"c{cut}"), cut, 0, revert_only=["manifests"])
