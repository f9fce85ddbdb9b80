"""Item 6 of issue 5: several processes saving to one repository at once."""

from __future__ import annotations

import time

import pytest
from harness import FULL, oracle, record

pytestmark = pytest.mark.reliability


def _chain(path: str) -> list[str]:
    from deltackpt.repo.repository import Repository
    core = Repository(path)
    out, cur = [], core.latest()
    while cur is not None:
        out.append(cur)
        cur = core.manifest(cur).parent
    return out


def _writers(zygote, path: str, n: int, saves: int, **job) -> list:
    kids = [zygote.start("save", path, steps=saves, seed=k, offset=1000 * (k + 1), **job) for k in range(n)]
    for c in kids:
        zygote.wait(c, 300)
    return kids


def _check_linear(path: str, kids: list) -> None:
    committed = [x for c in kids for x in c.committed()]
    chain = _chain(path)
    assert len(chain) == len(set(chain)) == len(committed), f"{len(chain)} versions in history, {len(committed)} saved"
    assert {v for v, _ in committed} == set(chain), "a committed version is missing from the linear history"
    oracle(path, expected=_labelled(kids), committed=committed)


def _labelled(kids) -> dict[int, str]:
    out = {}
    for c in kids:
        for line in c.lines():
            if line.startswith("ATTEMPT "):
                _, step, d = line.split()
                out[int(step)] = d
    return out


def test_four_writers_linear_history(zygote, tmp_path):
    """Four processes saving at once lose no update: every save that returned is in one linear history
    (each re-parents onto ``latest`` under the refs lock) and restores bit-identically."""
    t0 = time.monotonic()
    path = str(tmp_path / "r")
    n, saves = (8, 6) if FULL else (4, 3)
    kids = _writers(zygote, path, n, saves)
    for c in kids:
        assert "DONE" in c.lines(), c.text()
    _check_linear(path, kids)
    record("concurrent-writers", writers=n, saves_each=saves, lost=0, seconds=round(time.monotonic() - t0, 1))


def test_writers_racing_to_break_a_stale_refs_lock(zygote, tmp_path):
    """Regression: writers that all found the refs lock of a killed saver could each delete the lock
    another had just taken, then commit on the same parent (a lost update).  Now exactly one breaks it."""
    t0 = time.monotonic()
    rounds = 6 if FULL else 2
    for r in range(rounds):
        path = str(tmp_path / f"r{r}")
        dead = zygote.run("save", path, steps=2, fault="manifest.write:2:kill", seed=99, offset=50)
        assert dead.exit_code == -9
        kids = _writers(zygote, path, 5, 2)
        for c in kids:
            assert "DONE" in c.lines(), c.text()
        _check_linear(path, [dead, *kids])
    record("stale-lock-break-race", rounds=rounds, writers=5, lost=0, seconds=round(time.monotonic() - t0, 1))


def test_same_tag_one_winner(zygote, tmp_path):
    """Four savers asking for the same tag: exactly one commits with it, the others get ConflictError and
    commit nothing; four taggers racing for one name: one wins, three get ConflictError."""
    path = str(tmp_path / "r")
    kids = _writers(zygote, path, 4, 1, tag="release")
    won = [c for c in kids if c.committed()]
    lost = [c for c in kids if not c.committed()]
    assert len(won) == 1, [c.text() for c in kids]
    assert all(any(ln.startswith("ERROR ConflictError") for ln in c.lines()) for c in lost), [c.text() for c in lost]
    import deltackpt
    assert deltackpt.Repo(path).tags()["release"] == won[0].committed()[0][0]
    taggers = [zygote.start("tag", path, name="shared", version=won[0].committed()[0][0]) for _ in range(4)]
    for c in taggers:
        zygote.wait(c)
    assert sum(any(ln.startswith("TAGGED") for ln in c.lines()) for c in taggers) == 1
    assert sum(any(ln.startswith("ERROR ConflictError") for ln in c.lines()) for c in taggers) == 3
    oracle(path, expected=_labelled(kids), committed=won[0].committed())


def test_stale_lock_breaker_never_deletes_a_live_lock(zygote, tmp_path):
    """Regression, made deterministic with a sleep at the break: writer B judges the dead saver's refs
    lock stale and pauses before deleting it; writer A breaks it meanwhile and commits slowly under its
    new lock.  B must not delete A's live lock, so both commit, one after the other, in one history."""
    path = str(tmp_path / "r")
    dead = zygote.run("save", path, steps=2, fault="manifest.write:2:kill", seed=99, offset=50)
    assert dead.exit_code == -9
    b = zygote.start("save", path, steps=1, seed=1, offset=1000, fault="lock.refs.break:1:sleep1.0")
    time.sleep(0.3)
    a = zygote.start("save", path, steps=1, seed=2, offset=2000, fault="manifest.write:1:sleep2.0")
    for c in (a, b):
        zygote.wait(c, 60)
        assert "DONE" in c.lines(), c.text()
    _check_linear(path, [dead, a, b])


def test_holder_whose_lock_was_broken_does_not_release_the_new_holders_lock(tmp_path):
    """A refs-lock holder that was judged stale and broken, and whose lock another process then
    took, leaves that process's lock in place when it finishes (it deletes only its own)."""
    from deltackpt.repo import locks
    from deltackpt.store import LocalStore

    store = LocalStore(tmp_path / "repo")
    with locks.refs_lock(store):
        store.delete(locks.REFS_LOCK)  # broken by another host's breaker...
        assert store.put_if_absent(locks.REFS_LOCK, b"the new holder")  # ...and taken by it
    assert store.get(locks.REFS_LOCK) == b"the new holder"
