"""Item 2 of issue 5: SIGKILL at random times into a real training loop that saves every step, each
run resuming from ``latest`` like a real job would."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from harness import FULL, load_digest, oracle, record

pytestmark = pytest.mark.reliability


def _latest(path: str):
    from deltackpt.repo.repository import Repository
    if not os.path.exists(os.path.join(path, "config")):
        return None, None
    core = Repository(path)
    v = core.latest()
    return core, v


def test_random_kills_in_training_loop(zygote, tmp_path):
    """Killed at random moments (20 in CI, 500 in full mode), a training loop that saves every step never
    loses a committed step, resumes from a version that restores bit-identically (so the resumed run
    recomputes exactly the same states), and the repository verifies, saves and collects at the end."""
    import deltackpt
    kills = 500 if FULL else 20
    rng = random.Random(5)
    path = str(tmp_path / "r")
    expected: dict[int, str] = {}
    committed: list[tuple[str, str]] = []
    t0 = time.monotonic()
    killed_mid_save = 0
    for k in range(kills):
        core, latest = _latest(path)
        c = zygote.start("train", path, steps=10**6, start=1 if latest else 0)
        time.sleep(rng.uniform(0.0, 0.35))
        os.kill(c.pid, signal.SIGKILL)
        zygote.wait(c, 60)
        for step, d in c.attempts().items():
            assert expected.setdefault(step, d) == d, f"step {step} recomputed differently after a resume"
        mine = c.committed()
        committed += mine
        attempts = c.lines()
        killed_mid_save += bool(attempts and attempts[-1].startswith("ATTEMPT"))
        core, latest = _latest(path)
        if latest is not None:
            step = core.manifest(latest).step
            assert load_digest(path, latest) == expected[step], f"latest (step {step}) restores wrong bytes"
        for vid, d in mine[-2:]:
            assert load_digest(path, vid) == d, f"committed {vid} restores wrong bytes after kill {k}"
        if (k + 1) % 50 == 0 or k == kills - 1:
            oracle(path, expected=expected, committed=committed, next_save=False)
            # keep the repository small: a gc after crashes must keep the newest versions intact
            rep = deltackpt.gc(path, keep_last=5, grace_seconds=0)
            gone = set(rep.removed)
            committed = [(v, d) for v, d in committed if v not in gone]
    oracle(path, expected=expected, committed=committed, next_save=True)
    record("train-kills", points=kills, killed_mid_save=killed_mid_save, steps_committed=len(expected),
           lost=0, torn=0, wrong=0, seconds=round(time.monotonic() - t0, 1))
