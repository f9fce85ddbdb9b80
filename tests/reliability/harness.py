"""The crash harness (imported by the tests here): a fork server that runs child.py jobs, and the oracle every crash test ends with.

``DELTACKPT_RELIABILITY=full`` (``make reliability``) runs every point exhaustively; otherwise each
test runs a deterministic sample sized for CI.  Figures of a run go to ``$DELTACKPT_RELIABILITY_OUT``
(JSON lines) when set, for tests/RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import child as child_mod  # noqa: E402

FULL = os.environ.get("DELTACKPT_RELIABILITY") == "full"
full_only = pytest.mark.skipif(not FULL, reason="exhaustive: run with `make reliability` (DELTACKPT_RELIABILITY=full)")


def sample(items: list, n: int, seed: int = 0) -> list:
    """All items in full mode; else ``n`` spread deterministically over them (first and last included)."""
    if FULL or len(items) <= n:
        return list(items)
    rng = random.Random(seed)
    middle = rng.sample(items[1:-1], max(0, n - 2))
    return [items[0], *sorted(middle, key=items.index), items[-1]]


def record(test: str, **figures) -> None:
    """Append one test's figures to $DELTACKPT_RELIABILITY_OUT (for tests/RELIABILITY.md)."""
    path = os.environ.get("DELTACKPT_RELIABILITY_OUT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "full": FULL, **figures}) + "\n")


# ---------------------------------------------------------------------------------------------
# the fork server
@dataclass
class Child:
    rid: str
    pid: int
    out: str
    exit_code: int | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def lines(self) -> list[str]:
        try:
            with open(self.out) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def committed(self) -> list[tuple[str, str]]:
        return [tuple(line.split()[1:3]) for line in self.lines() if line.startswith("COMMITTED ")]

    def attempts(self) -> dict[int, str]:
        return {int(line.split()[1]): line.split()[2] for line in self.lines() if line.startswith("ATTEMPT ")}

    def text(self) -> str:
        return "\n".join(self.lines())


class Zygote:
    """One child.py fork server per test session: torch is imported once, each job is a fresh fork."""

    def __init__(self, workdir: str) -> None:
        env = {**os.environ, "PYTHONPATH": ROOT}
        env.pop("DELTACKPT_FAULT", None)
        env.pop("DELTACKPT_FAULT_TRACE", None)
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "child.py"), "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=ROOT)
        self.workdir = workdir
        self.children: dict[str, Child] = {}
        self._pids: dict[str, threading.Event] = {}
        self._pid_of: dict[str, int] = {}
        self._n = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            parts = raw.decode().split()
            if len(parts) != 3:
                continue
            what, rid, val = parts
            if what == "PID":
                self._pid_of[rid] = int(val)
                self._pids[rid].set()
            elif what == "EXIT" and rid in self.children:
                c = self.children[rid]
                c.exit_code = int(val)
                c.done.set()

    def start(self, workload: str, repo: str, **job) -> Child:
        with self._lock:
            self._n += 1
            rid = f"j{self._n}"
        out = os.path.join(self.workdir, f"{rid}.out")
        ev = threading.Event()
        self._pids[rid] = ev
        self.proc.stdin.write((json.dumps({"rid": rid, "workload": workload, "repo": repo, "out": out, **job}) + "\n")
                              .encode())
        self.proc.stdin.flush()
        if not ev.wait(60):
            raise RuntimeError("fork server did not answer")
        c = Child(rid, self._pid_of[rid], out)
        self.children[rid] = c
        return c

    def wait(self, c: Child, timeout: float = 120.0) -> int:
        if not c.done.wait(timeout):
            os.kill(c.pid, signal.SIGKILL)
            c.done.wait(10)
            raise AssertionError(f"job {c.rid} hung for {timeout}s:\n{c.text()}")
        return c.exit_code

    def run(self, workload: str, repo: str, timeout: float = 120.0, **job) -> Child:
        c = self.start(workload, repo, **job)
        self.wait(c, timeout)
        return c

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(30)
        except Exception:
            self.proc.kill()


# ---------------------------------------------------------------------------------------------
# the oracle
@dataclass
class OracleResult:
    versions: int = 0
    leftover_temps: int = 0      # temp files the fault left (reclaimed by the gc of step d)
    stale_locks: int = 0         # lock files of dead processes found (broken by step d)
    unindexed_packs: int = 0


def load_digest(path: str, vid: str) -> str:
    import deltackpt
    return child_mod.state_digest(deltackpt.load(path, vid))


def oracle(path: str, *, expected: dict[int, str], committed: list[tuple[str, str]],
           must_exist: set[str] | None = None, next_save: bool = True, full_verify: bool = True) -> OracleResult:
    """Checks (a)-(d) of tests/RELIABILITY.md on the repository at ``path`` after a fault.

    ``expected`` maps a step to the digest of the state saved at that step (every attempt);
    ``committed`` lists (version, digest) of saves that returned; ``must_exist`` narrows the
    committed versions that must still be there (gc may legitimately have removed others).
    """
    import deltackpt
    from deltackpt.repo.locks import LOCKS
    from deltackpt.repo.repository import Repository

    res = OracleResult()
    if not os.path.exists(os.path.join(path, "config")):
        assert not committed, f"repository config is gone but {len(committed)} versions were committed"
        return res
    core = Repository(path)
    vids = set(core.version_ids())
    res.versions = len(vids)
    res.leftover_temps = len(core.store.temp_files())
    res.stale_locks = len(core.store.list(LOCKS))
    _check_versions(path, core, vids, expected=expected, committed=committed, must_exist=must_exist)
    # (c) verify passes; leftovers are warnings only
    if full_verify:
        rep = deltackpt.Repo(path).verify()
        assert rep.ok, f"verify failed after the fault: {[p.to_json() for p in rep.errors]}"
        res.unindexed_packs = sum("no index refers" in p.problem for p in rep.warnings)
    # (d) the next save and a gc work, and reclaim the leftovers
    if next_save:
        model = child_mod.make_model(seed=7)
        state = {"model": model.state_dict(), "step": -1}
        v = deltackpt.save(state, path, step=-1)
        assert load_digest(path, v.id) == child_mod.state_digest(state)
        deltackpt.gc(path, grace_seconds=0)
        core = Repository(path)
        assert core.store.temp_files() == [], "gc left temp files behind"
        assert core.store.list(LOCKS) == [], f"locks left after save+gc: {core.store.list(LOCKS)}"
        if full_verify:
            rep = deltackpt.Repo(path).verify()
            assert rep.ok and not rep.warnings, [p.to_json() for p in rep.errors + rep.warnings]
        assert core.latest() == v.id
        for vid in vids:
            if vid in set(core.version_ids()):
                continue
            raise AssertionError(f"gc with no retention rule removed version {vid}")
    return res


def _check_versions(path: str, core, vids: set[str], *, expected: dict[int, str],
                    committed: list[tuple[str, str]], must_exist: set[str] | None) -> None:
    """Checks (a) and (b) of the oracle, and that ``latest`` names a version that is there."""
    # (a) committed versions restore bit-identically
    for vid, d in committed:
        if must_exist is not None and vid not in must_exist:
            continue
        assert vid in vids, f"committed version {vid} was lost"
        assert load_digest(path, vid) == d, f"committed version {vid} restores different bytes"
    # (b) every visible version is complete and right (the interrupted one included)
    checked = {vid: d for vid, d in committed if must_exist is None or vid in must_exist}
    for vid in sorted(vids):
        step = core.manifest(vid).step
        d = checked.get(vid) or load_digest(path, vid)
        assert step in expected, f"version {vid} has step {step}, which no job attempted"
        assert d == expected[step], f"version {vid} (step {step}) is visible but restores wrong bytes"
    latest = core.latest()
    assert latest is None or latest in vids, f"refs/latest names {latest}, which has no manifest"


def trace_sites(zygote: Zygote, tmp_path, workload: str, repo: str, **job) -> list[str]:
    """Every fault site a job hits, in order (DELTACKPT_FAULT_TRACE)."""
    trace = str(tmp_path / f"trace-{workload}-{random.random()}.txt")
    c = zygote.run(workload, repo, trace=trace, **job)
    assert "DONE" in c.lines(), c.text()
    with open(trace) as f:
        return f.read().split()


def occurrences(sites: list[str]) -> list[tuple[str, int]]:
    """(site, n) for every hit, n counting hits of that exact site so far (the fault spec's N)."""
    seen: dict[str, int] = {}
    out = []
    for s in sites:
        seen[s] = seen.get(s, 0) + 1
        out.append((s, seen[s]))
    return out


def wait_for(pred, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
