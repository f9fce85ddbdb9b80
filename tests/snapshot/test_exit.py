"""A background save (thread mode) is never lost when the script ends: real scripts in real
subprocesses, states of 256 MiB, ended by running off their last line, ``sys.exit``, an uncaught
exception, Ctrl-C (SIGINT) and SIGTERM; a second Ctrl-C abandons the save and leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import deltackpt
from tests.conftest import ROOT

MIB_PER_LAYER = 32
LAYERS = 8          # 256 MiB: the save takes seconds, far longer than the script's exit

_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time, torch, deltackpt
    path, how, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if how == "own-sigterm-handler":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    g = torch.Generator().manual_seed(11)
    state = {f"layer{i}.weight": torch.randn(2048, 4096, generator=g) for i in range(layers)}
    if how == "checkpointer":
        ckpt = deltackpt.Checkpointer(path, policy=1)     # never closed
        ckpt.step(state, step=1)
    else:
        h = deltackpt.save(state, path, step=1, blocking=False)
    print("submitted", flush=True)
    if how == "sys.exit":
        sys.exit(3)
    if how == "raise":
        raise RuntimeError("the training loop crashed")
    if how == "fork":
        import multiprocessing
        child = multiprocessing.get_context("fork").Process(target=print, args=("child",))
        child.start()
        child.join(60)
        print("child exit", child.exitcode, flush=True)
    if how == "ctrl-c-in-the-next-save":
        print("next save", flush=True)
        deltackpt.save({"w": torch.ones(3)}, path, step=2, blocking=False)   # waits for the first
        print("next save returned", flush=True)
    if how == "idle-then-signal":
        h.wait()
        print("committed", flush=True)
    if how in ("signal", "own-sigterm-handler", "idle-then-signal"):
        # the training loop goes on until a signal stops it: steps, not one 300 s sleep (a signal
        # landing between the print and a lone sleep's start is noticed only when that sleep ends)
        for _ in range(3000):
            time.sleep(0.1)
    """)


def _expected(layers: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {f"layer{i}.weight": torch.randn(2048, 4096, generator=g) for i in range(layers)}


class Script:
    """The script above in its own session (signals reach it alone); a thread per pipe collects its
    lines as they come, so the test can wait for one (select on a buffered pipe would miss lines)."""

    def __init__(self, repo: str, how: str, layers: int = LAYERS, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, repo, how, str(layers)],
                                     env={**os.environ, "PYTHONPATH": ROOT, "PYTHONFAULTHANDLER": "1", **(env or {})},
                                     start_new_session=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._readers = [threading.Thread(target=self._read, args=(name,), daemon=True) for name in self.lines]
        for t in self._readers:
            t.start()

    def _read(self, name: str) -> None:
        for line in getattr(self.proc, name):
            self.lines[name].append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines["stdout"])

    def wait_for(self, stream: str, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in list(self.lines[stream])):
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self._readers[0].is_alive()):
                raise AssertionError(f"no {text!r} on {stream}; stderr: {''.join(self.lines['stderr'])}")
            time.sleep(0.01)

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = _status(self.proc.pid)
            os.kill(self.proc.pid, signal.SIGABRT)   # PYTHONFAULTHANDLER: every thread's stack on stderr
            time.sleep(3)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            for t in self._readers:
                t.join(30)
            raise AssertionError(f"the script did not end in {timeout} s ({status}):\n"
                                 + "".join(self.lines["stderr"])) from None
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for t in self._readers:
            t.join(30)
        return self.proc.returncode, "".join(self.lines["stderr"])


def _status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return ", ".join(ln.strip() for ln in f if ln.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")))
    except OSError:
        return "gone"


def _leftovers(repo: str) -> list[str]:
    return [os.path.join(d, n) for d in ("tmp", "locks") for n in os.listdir(os.path.join(repo, d))
            if os.path.isdir(os.path.join(repo, d))] if os.path.isdir(repo) else []


def _committed_bit_identical(repo: str, layers: int = LAYERS) -> None:
    r = deltackpt.Repo(repo)
    assert [v.step for v in r.log()] == [1]
    loaded = deltackpt.load(repo)
    for k, t in _expected(layers).items():
        assert torch.equal(loaded[k], t), k
    assert _leftovers(repo) == []


# 256 MiB for the plain case; 64 MiB (two layers, 32 chunks) for the other ways out, enough for
# the save to still be writing when the interpreter exits (on the old code each lost its version)
@pytest.mark.parametrize("how,status,layers", [("last-line", 0, LAYERS), ("sys.exit", 3, 2), ("raise", 1, 2),
                                               ("checkpointer", 0, 2)])
def test_the_script_ends_with_a_background_save_pending_and_it_commits(tmp_path, how, status, layers):
    """The save is the script's last act (or a Checkpointer never closed; or sys.exit / a crash right
    after it): the exit finishes it, says so, and the version loads bit for bit."""
    repo = str(tmp_path / "repo")
    script = Script(repo, how, layers)
    code, err = script.finish()
    assert code == status, err
    assert "finishing 1 background save(s) before exit" in err, err
    _committed_bit_identical(repo, layers)


@pytest.mark.parametrize("layers", [LAYERS, pytest.param(24, marks=pytest.mark.slow, id="768MiB")])
@pytest.mark.parametrize("sig,status", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_a_signal_during_a_background_save_stops_the_script_and_the_save_commits(tmp_path, sig, status, layers):
    """Ctrl-C (KeyboardInterrupt, then the exit) or SIGTERM (SystemExit(143) while a save is
    pending) during a 256 MiB (slow: 768 MiB) background save: the script stops, the save commits."""
    repo = str(tmp_path / "repo")
    script = Script(repo, "signal", layers)
    script.wait_for("stdout", "submitted")
    os.kill(script.proc.pid, sig)
    code, err = script.finish()
    assert code == status, err
    _committed_bit_identical(repo, layers)


def test_sigterm_with_no_save_pending_kills_as_it_always_did(tmp_path):
    """Once the save committed, SIGTERM ends the process by the signal, as without deltackpt."""
    repo = str(tmp_path / "repo")
    script = Script(repo, "idle-then-signal", layers=1)
    script.wait_for("stdout", "committed")
    os.kill(script.proc.pid, signal.SIGTERM)
    code, err = script.finish()
    assert code == -signal.SIGTERM, err
    assert "finishing" not in err


def test_an_applications_own_sigterm_handler_is_left_alone(tmp_path):
    """A SIGTERM handler installed by the application decides; its sys.exit still finishes the save."""
    repo = str(tmp_path / "repo")
    script = Script(repo, "own-sigterm-handler", layers=2)
    script.wait_for("stdout", "submitted")
    os.kill(script.proc.pid, signal.SIGTERM)
    code, err = script.finish()
    assert code == 7, err
    _committed_bit_identical(repo, 2)


def test_a_second_ctrl_c_abandons_the_save_promptly_and_leaves_nothing(tmp_path):
    """Ctrl-C, then Ctrl-C again while the exit finishes the save: the process ends within seconds,
    no version, no pack, no temp file, no lock is left."""
    repo = str(tmp_path / "repo")
    script = Script(repo, "signal")
    script.wait_for("stdout", "submitted")
    os.kill(script.proc.pid, signal.SIGINT)
    script.wait_for("stderr", "finishing 1 background save(s)")
    t0 = time.monotonic()
    os.kill(script.proc.pid, signal.SIGINT)
    code, err = script.finish()
    took = time.monotonic() - t0
    assert "abandoned; nothing of them was committed" in err, err
    assert took < 10, took
    assert deltackpt.Repo(repo).log() == []
    written = [os.path.join(d, *names) for d in ("packs", "index", "tmp", "locks")
               for names in _files(os.path.join(repo, d))]
    assert written == [], written


def _files(root: str) -> list[tuple[str, ...]]:
    return [(os.path.relpath(os.path.join(d, n), root),) for d, _, names in os.walk(root) for n in names]


def test_a_forked_child_does_not_wait_for_the_parents_save(tmp_path):
    """A DataLoader-style fork while a save is pending: the child exits at once (it has no save
    thread to wait for), the parent's exit commits the save."""
    repo = str(tmp_path / "repo")
    script = Script(repo, "fork", layers=2)
    script.wait_for("stdout", "submitted")
    code, err = script.finish()
    assert code == 0, err
    assert "child exit 0" in script.out, script.out
    assert err.count("finishing") == 1, err      # the parent's exit only
    _committed_bit_identical(repo, 2)


def test_ctrl_c_while_the_next_save_waits_for_the_previous_one(tmp_path):
    """The next background save waits for the one in flight (one at a time); Ctrl-C during that wait
    stops the script, and the exit still finishes the first save (the wait used to drop it from
    the saves in flight, so the exit did not wait for it)."""
    repo = str(tmp_path / "repo")
    script = Script(repo, "ctrl-c-in-the-next-save", layers=2, env={"DELTACKPT_FAULT": "pack.fsync:1:sleep4"})
    script.wait_for("stdout", "next save")
    time.sleep(1.0)                        # inside the wait: the first save sleeps at its first pack
    os.kill(script.proc.pid, signal.SIGINT)
    code, err = script.finish()
    assert code == -signal.SIGINT and "next save returned" not in script.out, err
    assert "finishing 1 background save(s)" in err, err
    _committed_bit_identical(repo, 2)


_THREADS_SCRIPT = textwrap.dedent("""
    import signal, sys, threading, time, torch, deltackpt
    state = {f"layer{i}.weight": torch.randn(2048, 4096) for i in range(2)}
    h = deltackpt.save(state, sys.argv[1], step=1, blocking=False)
    time.sleep(0.5)                      # the save's threads and their encoder pool have started
    def blocked(tid):
        with open(f"/proc/self/task/{tid}/status") as f:
            mask = int(next(ln for ln in f if ln.startswith("SigBlk")).split()[1], 16)
        return all(mask >> (s - 1) & 1 for s in (signal.SIGINT, signal.SIGTERM))
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and t.native_id]
    print(len(others), sorted({t.name.split("_")[0] for t in others if not blocked(t.native_id)}), flush=True)
    print("main blocks", blocked(threading.main_thread().native_id), flush=True)
    h.wait()
    """)


def test_deltackpts_threads_leave_signals_to_the_main_thread(tmp_path):
    """The kernel gives a process's SIGINT/SIGTERM to any thread not blocking it; had a save thread
    taken a Ctrl-C, a main thread asleep in one long C call would not wake (the CI once saw a
    script sleep on through its Ctrl-C).  Every thread a background save starts blocks them; the
    main thread does not."""
    # the save sleeps at its first pack's fsync, so its threads are still there when they are looked at
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(tmp_path / "repo")],
                         env={**os.environ, "PYTHONPATH": ROOT, "DELTACKPT_FAULT": "pack.fsync:1:sleep3"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    count, unblocked = first.split(" ", 1)
    assert int(count) >= 2 and unblocked == "[]", out.stdout      # the save thread and its encoders
    assert second == "main blocks False", out.stdout


def test_a_background_save_made_from_an_atexit_handler_runs_inline(tmp_path):
    """An ``atexit`` handler that saves in the background, with a layout never seen before, when
    the interpreter no longer starts threads: the save runs inline and commits, with no
    ``cannot schedule new futures after interpreter shutdown``."""
    script = textwrap.dedent("""
        import atexit, sys, torch, deltackpt
        path = sys.argv[1]
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 7))
        def last_words():
            h = deltackpt.save(model, path, step=9, blocking=False)
            print("saved", h.wait().step, flush=True)
        atexit.register(last_words)
    """)
    path = str(tmp_path / "r")
    p = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "saved 9" in p.stdout
    assert deltackpt.Repo(path).latest().step == 9


def test_after_a_killed_save_the_recovering_save_and_gc_leave_no_lock(tmp_path):
    """A save SIGKILLed while writing its packs leaves its lock; the next process's save (which
    deltifies inline, within its call) and ``gc(grace_seconds=0)`` leave ``locks/`` with no save lock."""
    script = textwrap.dedent("""
        import sys, torch, deltackpt
        path, step = sys.argv[1], int(sys.argv[2])
        g = torch.Generator().manual_seed(step)
        state = {f"w{i}": torch.randn(512, 1024, generator=g) for i in range(8)}
        deltackpt.save(state, path, step=step)
    """)
    path = str(tmp_path / "r")
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = lambda step, **extra: subprocess.run([sys.executable, "-c", script, path, str(step)], cwd=ROOT,  # noqa: E731
                                               env={**env, **extra}, capture_output=True, text=True, timeout=120)
    assert run(0).returncode == 0
    killed = run(1, DELTACKPT_FAULT="pack.write:2:kill")
    assert killed.returncode == -signal.SIGKILL
    assert any(n.startswith("save") for n in os.listdir(os.path.join(path, "locks")))
    assert run(2).returncode == 0
    deltackpt.gc(path, keep_last=2, grace_seconds=0)
    left = [n for n in os.listdir(os.path.join(path, "locks")) if n.startswith("save")]
    assert left == [], left
