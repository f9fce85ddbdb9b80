"""What a save stopped mid-way leaves, and who removes it (issue 23, item 15): real processes saving
192 MiB states (several 64 MiB packs), stopped by a real Ctrl-C or SIGKILL after their first pack
was written, next to a live save frozen (SIGSTOP) at the same point whose files must survive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import torch

import deltackpt
from tests.conftest import ROOT, proc_state

LAYERS = 6   # 6 x 32 MiB of random floats: three packs

_SCRIPT = textwrap.dedent("""
    import sys, torch, deltackpt
    path, seed = sys.argv[1], int(sys.argv[2])
    g = torch.Generator().manual_seed(seed)
    state = {f"layer{i}.weight": torch.randn(2048, 4096, generator=g) for i in range(%d)}
    deltackpt.save(state, path, step=seed)
    print("committed", flush=True)
    """ % LAYERS)


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(2048, 4096, generator=g) for i in range(LAYERS)}


def _start(repo: str, seed: int, fault: str | None = None, trace: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT}
    if fault:
        env["DELTACKPT_FAULT"] = fault
    if trace:
        env["DELTACKPT_FAULT_TRACE"] = trace
    return subprocess.Popen([sys.executable, "-c", _SCRIPT, repo, str(seed)], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until(cond, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _files(repo: str, folder: str) -> list[str]:
    root = os.path.join(repo, folder)
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names)


def _unindexed_packs(repo: str) -> list[str]:
    r = deltackpt.Repo(repo).core
    r.index.refresh()
    named = {pid for _cid, pid, _e in r.index.items(all_copies=True)}
    return [p for p in _files(repo, "packs") if os.path.basename(p) not in named]


def _interrupt_save(tmp_path, interrupt, **start) -> None:
    """Start a save of the big state into a repository that already holds version 0, call
    ``interrupt(proc)`` to Ctrl-C it, and check that the save stopped (KeyboardInterrupt) and
    deleted every pack it wrote: nothing of it is left anywhere."""
    repo = str(tmp_path / "repo")
    deltackpt.save({"w": torch.ones(8)}, repo, step=0)       # the repository exists: only the save's files matter
    before = {d: _files(repo, d) for d in ("packs", "index")}
    proc = _start(repo, 1, **start)
    try:
        interrupt(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert {d: _files(repo, d) for d in ("packs", "index")} == before
    assert _files(repo, "tmp") == [] and _files(repo, "locks") == []
    assert [v.step for v in deltackpt.Repo(repo).log()] == [0]


def test_ctrl_c_during_a_blocking_save_leaves_no_pack(tmp_path):
    """SIGINT once the first 64 MiB pack is written and the second is being written."""
    trace = str(tmp_path / "trace")

    def second_pack_started() -> bool:
        sites = open(trace).read().split() if os.path.exists(trace) else []
        return "pack.fsync" in sites and "pack.write" in sites[sites.index("pack.fsync"):]

    def interrupt(proc: subprocess.Popen) -> None:
        _until(second_pack_started, "the second pack")
        os.kill(proc.pid, signal.SIGINT)

    _interrupt_save(tmp_path, interrupt, trace=trace)


def test_ctrl_c_while_a_full_pack_is_fsynced_leaves_no_pack(tmp_path):
    """The same Ctrl-C landing exactly where it is most likely to: during the fsync that seals a
    full pack (frozen there, SIGINT queued, then let go).  The KeyboardInterrupt is raised once
    the fsync returns, while that pack is between being written and being sealed; the save must
    still delete it (a CI run once found it left under tmp/)."""
    def interrupt(proc: subprocess.Popen) -> None:
        _until(lambda: proc_state(proc.pid) == "T", "the save to freeze at its first fsync")
        os.kill(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGCONT)

    _interrupt_save(tmp_path, interrupt, fault="pack.fsync:1:stop")


def test_the_next_save_removes_what_a_killed_save_left_and_nothing_of_a_live_one(tmp_path):
    """Save A is SIGKILLed after its first pack; save B, alive, is frozen at the same point.  The
    next save deletes A's temp files and lock (A is provably dead) and touches none of B's; B then
    resumes and commits, and every version loads bit for bit."""
    repo = str(tmp_path / "repo")
    deltackpt.save({"w": torch.ones(8)}, repo, step=0)
    # B first, frozen before A starts: had A died before B took its save lock, B's own start
    # would have cleared A's leftovers (correctly), leaving this test nothing to look at
    frozen = _start(repo, 2, fault="pack.fsync:2:stop")
    killed = None
    try:
        _until(lambda: proc_state(frozen.pid) == "T", "save B to freeze")
        killed = _start(repo, 1, fault="pack.fsync:2:kill")
        killed.communicate(timeout=120)
        assert killed.returncode == -signal.SIGKILL
        left = _files(repo, "tmp")
        assert any(f"-{killed.pid}-" in n for n in left), left   # A's sealed pack, held aside
        mine = [n for n in left if f"-{frozen.pid}-" in n]
        assert len(mine) == 2, left           # B's sealed first pack and the one it was writing

        deltackpt.save({"w": torch.full((8,), 2.0)}, repo, step=3)   # the next save

        assert _files(repo, "tmp") == mine                           # A's gone, B's all there
        assert [n for n in _files(repo, "locks") if f"-{killed.pid}-" in n] == []
        assert [n for n in _files(repo, "locks") if f"-{frozen.pid}-" in n] != []
        assert _unindexed_packs(repo) == []
        os.kill(frozen.pid, signal.SIGCONT)
        out, err = frozen.communicate(timeout=120)
        assert "committed" in out, err
    finally:
        for p in (killed, frozen):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    r = deltackpt.Repo(repo)
    assert sorted(v.step for v in r.log()) == [0, 2, 3]
    loaded = deltackpt.load(repo, [v for v in r.log() if v.step == 2][0])
    assert all(torch.equal(loaded[k], t) for k, t in _state(2).items())
    assert _files(repo, "tmp") == [] and _files(repo, "locks") == []


def test_gc_removes_a_killed_saves_temp_files_without_waiting_for_the_grace_period(tmp_path):
    """gc (default 600 s grace) after a save SIGKILLed mid-way: its temp files and lock go at once,
    because its holder is provably dead."""
    repo = str(tmp_path / "repo")
    deltackpt.save({"w": torch.ones(8)}, repo, step=0)
    killed = _start(repo, 1, fault="pack.fsync:2:kill")
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert _files(repo, "tmp") != []
    deltackpt.Repo(repo).gc(keep_last=5)
    assert _files(repo, "tmp") == [] and _files(repo, "locks") == []
    assert _unindexed_packs(repo) == []


def test_an_aborted_save_deletes_its_temp_pack_even_one_no_list_recorded(tmp_path):
    """A Ctrl-C can land after a writer created its temp file and before the packer recorded that
    writer: abort() finds the file by the save lock's mark in its name, and leaves another save's."""
    from types import SimpleNamespace
    from deltackpt.repo.write.packer import Packer
    path = str(tmp_path / "repo")
    deltackpt.save({"w": torch.ones(8)}, path, step=0)
    core = deltackpt.Repo(path).core
    packer = Packer(core, SimpleNamespace(packs=0, objects_bytes=0), owner="save-mine-1")
    stray = core.store.writer(site="pack", owner="save-mine-1")      # created, never handed to the packer
    stray.write(b"x" * 4096)
    other = core.store.writer(site="pack", owner="save-other-2")
    other.write(b"y" * 4096)
    try:
        packer.abort()
        left = _files(path, "tmp")
        assert len(left) == 1 and left[0].startswith("pack.save-other-2."), left
    finally:
        stray.abort()
        other.abort()
    assert _files(path, "tmp") == []
