"""Background saves in the encoder process: same bytes as in-process saves, real process deaths,
errors raised in the parent, staging memory reused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import deltackpt
from deltackpt.repo.write import encoder_process
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not encoder_process.supported(), reason="needs Linux memfd")


@pytest.fixture
def repo(repo_path):
    """A handle whose background saves run in its encoder process (closed, with the process, after)."""
    with deltackpt.Repo(repo_path, create=True, background="process") as r:
        yield r


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 32, generator=g)
    return {"w": w, "tied": w[3:9], "t": w.t(),                          # shared storage, a transposed view
            "half": torch.randn(1000, generator=g).to(torch.bfloat16), "f8": torch.randn(77, generator=g).to(torch.float8_e4m3fn),
            "c": torch.randn(5, 3, dtype=torch.complex64, generator=g), "b": torch.rand(40, generator=g) > 0.5,
            "u": torch.randint(0, 60000, (33,), dtype=torch.uint16, generator=g), "zero_d": torch.tensor(-0.0),
            "empty": torch.empty(0, 7), "nan": torch.tensor([float("nan"), 1e-42, -float("inf")]), "step": seed}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731 - bits, NaN payloads and -0.0 included
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def test_process_saves_are_bit_identical_and_keep_sharing(repo_path, repo):
    """Versions written by the encoder process load bit for bit (odd dtypes, NaN, -0.0, 0-d, empty,
    views), views of one storage come back sharing it, and later versions are stored as deltas."""
    states = [_state(s) for s in range(3)]
    for s in states[1:]:  # small drift, so deltas pay
        s["w"].copy_(states[0]["w"] + 1e-3 * torch.randn(64, 32))
    for i, s in enumerate(states):
        v = repo.save(s, step=i, blocking=False).wait()
        assert v.step == i
    enc = repo.runtime.encoder_started
    assert enc is not None and enc.proc.pid != os.getpid()
    assert repo.session.delta_cache.used_bytes == 0   # the work happened elsewhere
    for i, s in enumerate(states):
        out = deltackpt.load(repo_path, f"latest~{2 - i}")
        for k, t in s.items():
            assert _same(out[k], t) if isinstance(t, torch.Tensor) else out[k] == t, (i, k)
        assert out["tied"].untyped_storage().data_ptr() == out["w"].untyped_storage().data_ptr()
    encodings = deltackpt.Repo(repo_path).show("latest")["written"]["encodings"]
    assert set(encodings) - {"zstd", "raw", "bytegroup-zstd"}, encodings   # some delta codec was used
    assert deltackpt.Repo(repo_path).verify().ok


def test_one_staging_segment_serves_every_save_and_deltas_are_still_written(repo_path, repo):
    """Each save's segment goes back to the pool once the child has stored the version, and the
    next save stages into it: one segment in all, however many saves; the child keeps the bases it
    needs itself, so later versions are still stored as deltas (of the rows that changed)."""
    used = []
    w = torch.randn(256, 256)
    for step in range(5):
        w[7 * step].add_(1e-4)
        repo.save({"w": w}, step=step, blocking=False).wait()
        used.append(repo.runtime.staging.last_ids)
    assert len(set(used)) == 1
    written = deltackpt.Repo(repo_path).show("latest")["written"]["encodings"]
    assert set(written) & {"xor-delta", "sub-delta", "scaled-delta", "sparse"}, written


@pytest.mark.parametrize("background", ["thread", "process"])
def test_a_delta_base_is_forgotten_before_its_staging_memory_is_reused(repo_path, background):
    """``b`` is missing from the second save, so its delta base still views the first save's
    staging memory when the third save copies into that memory.  The base must have been dropped
    (``b`` is then a keyframe), or ``b`` would be stored as a delta against its own new bytes."""
    a, b = torch.randn(300, 200), torch.randn(200, 300)   # shapes differ: the thread pool hands b its own buffer
    b3 = b + 1e-3
    with deltackpt.Repo(repo_path, create=True, background=background) as repo:
        repo.save({"a": a, "b": b}, step=1, blocking=False).wait()
        repo.save({"a": a + 1}, step=2, blocking=False).wait()
        repo.save({"a": a, "b": b3}, step=3, blocking=False).wait()
    assert torch.equal(deltackpt.load(repo_path)["b"], b3)
    assert deltackpt.Repo(repo_path).verify().ok


def test_killed_encoder_fails_the_save_with_a_typed_error_and_the_next_save_restarts_it(repo_path, repo):
    repo.save(_state(0), step=0, blocking=False).wait()
    enc = repo.runtime.encoder_started
    os.kill(enc.proc.pid, signal.SIGSTOP)          # frozen, so the kill lands during the next save
    h = repo.save(_state(1), step=1, blocking=False)
    time.sleep(0.2)
    os.kill(enc.proc.pid, signal.SIGKILL)
    with pytest.raises(encoder_process.EncoderProcessError, match=r"died during the save of step 1"):
        h.wait()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [0]
    v = repo.save(_state(2), step=2, blocking=False).wait()
    assert repo.runtime.encoder_started.proc.pid != enc.proc.pid and v.step == 2
    assert deltackpt.Repo(repo_path).verify().ok


def test_a_lost_connection_restarts_the_encoder_even_before_the_child_can_be_reaped(repo_path, repo):
    """A killed child closes its socket a moment before the kernel lets it be reaped, so "is it
    still running" can say yes right after a save saw it die (a loaded machine showed it).  The save
    that lost the connection marks the process; the next save starts a new one.  Simulated with a
    child that is alive but whose connection is gone."""
    import socket
    repo.save(_state(0), step=0, blocking=False).wait()
    enc = repo.runtime.encoder_started
    enc.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(encoder_process.EncoderProcessError, match=r"during the save of step 1"):
        repo.save(_state(1), step=1, blocking=False).wait()
    assert enc.proc.poll() is None   # still running: only the mark tells
    v = repo.save(_state(2), step=2, blocking=False).wait()
    assert repo.runtime.encoder_started is not enc and v.step == 2
    assert enc.proc.wait(30) is not None   # the marked one was closed, not left behind
    assert deltackpt.Repo(repo_path).verify().ok


def test_an_error_in_the_encoder_process_is_raised_in_the_parent_with_its_type(repo_path, repo):
    """A tag that already exists is refused at commit, in the child; the parent gets the same
    ConflictError, and the earlier version is untouched."""
    repo.save(_state(0), step=0, tag="warm", blocking=False).wait()
    h = repo.save(_state(1), step=1, tag="warm", blocking=False)
    with pytest.raises(deltackpt.ConflictError, match="warm"):
        h.wait()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [0]


def test_a_repository_deleted_and_created_again_is_not_confused_with_the_old_one(repo_path):
    """A handle whose repository was deleted refuses to save (its encoder process is not asked to
    create it again); a new handle on the new repository saves through a new encoder process."""
    import shutil
    with deltackpt.Repo(repo_path, create=True, background="process") as repo:
        repo.save(_state(0), step=0, blocking=False).wait()
        shutil.rmtree(repo_path)
        deltackpt.Repo.init(repo_path).close()
        with pytest.raises(deltackpt.NotARepositoryError, match="another repository replaced"):
            repo.save(_state(1), step=1, blocking=False).wait()
    with deltackpt.Repo(repo_path, background="process") as repo:
        repo.save(_state(1), step=1, blocking=False).wait()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [1]
    assert deltackpt.Repo(repo_path).verify().ok


def test_a_save_survives_its_training_process_being_killed(tmp_path):
    """The training process is SIGKILLed right after handing a background save to the encoder
    process: the child finishes it, so the version lands and verifies."""
    repo = str(tmp_path / "repo")
    script = textwrap.dedent(f"""
        import os, signal, time, torch, deltackpt
        handle = deltackpt.Repo({repo!r}, create=True, background="process")
        state = {{"w": torch.randn(512, 1024), "step": 7}}
        handle.save(state, step=1, blocking=False).wait()
        state["w"].add_(1)
        h = handle.save(state, step=2, blocking=False)
        torch.save(state, {str(tmp_path / "expected.pt")!r})
        child = handle.runtime.encoder_started.proc.pid
        locks = os.path.join({repo!r}, "locks")
        deadline = time.monotonic() + 60
        # the child has the job once it holds a save lock, or once it has even committed it already
        while not any(f"-{{child}}-" in f for f in os.listdir(locks)) and not h.done():
            assert time.monotonic() < deadline, "the encoder process never took the save"
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    # a manifest is listed before the ref moves (spec §14): wait for what latest names, not for log()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        head = deltackpt.Repo(repo).latest()
        if head is not None and head.step == 2:
            break
        time.sleep(0.1)
    r = deltackpt.Repo(repo)
    assert [v.step for v in r.log()] == [2, 1]
    expected = torch.load(str(tmp_path / "expected.pt"))
    assert torch.equal(deltackpt.load(repo)["w"], expected["w"]) and r.verify().ok


def test_checkpointer_saves_through_the_encoder_process_when_asked(repo_path):
    """``background="process"`` reaches the encoder process from the Checkpointer, and an unknown
    value is refused before anything is written."""
    with pytest.raises(deltackpt.DeltackptError, match="background must be"):
        deltackpt.save({"w": torch.ones(3)}, repo_path, blocking=False, background="fork")
    ckpt = deltackpt.Checkpointer(repo_path, policy=1, background="process")
    w = torch.randn(128, 64)
    for step in range(1, 4):
        w.add_(1e-3)
        ckpt.step({"w": w}, step=step)
    ckpt.wait()
    assert ckpt.repo.runtime.staging._segments    # the staging copy was a shared segment, pooled again
    ckpt.close()
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [3, 2, 1]
    assert torch.equal(deltackpt.load(repo_path)["w"], w)


_CTRL_C_SCRIPT = textwrap.dedent("""
    import sys, time, torch, deltackpt
    path, wait, background = sys.argv[1], sys.argv[2] == "wait", sys.argv[4]
    w = torch.Generator().manual_seed(7)
    state = {"w": torch.randn(512, 256, generator=w), "step": 1}
    torch.save(state, sys.argv[3])                      # what the save must bring back
    h = deltackpt.save(state, path, step=1, blocking=False, background=background)
    if wait:
        h.wait()
    else:
        time.sleep(120)                                 # the training loop goes on; nobody waits
    """)


@pytest.mark.parametrize("background", ["process", "thread"])
@pytest.mark.parametrize("wait", ["wait", "no-wait"])
def test_ctrl_c_to_the_process_group_does_not_lose_a_save_the_encoder_received(tmp_path, wait, background):
    """SIGINT to the whole process group (Ctrl-C in a terminal) while a background save holds the
    save lock (in the encoder process, or the save thread): the save finishes, commits and loads bit
    for bit, whether or not the training process was waiting for it, and the process says so."""
    repo, trace, expected = str(tmp_path / "repo"), tmp_path / "trace", str(tmp_path / "expected.pt")
    env = {**os.environ, "PYTHONPATH": ROOT, "DELTACKPT_FAULT": "pack.fsync:1:sleep5",
           "DELTACKPT_FAULT_TRACE": str(trace)}
    # its own session: killpg reaches the script and whatever stayed in its process group
    proc = subprocess.Popen([sys.executable, "-c", _CTRL_C_SCRIPT, repo, wait, expected, background], env=env,
                            start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (trace.exists() and "pack.fsync" in trace.read_text()):   # the encoder holds the save lock
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else ""
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "KeyboardInterrupt" in err, err          # the training process was interrupted as asked
    r = deltackpt.Repo(repo)
    assert [v.step for v in r.log()] == [1], err    # ... and the save it had handed over committed
    assert torch.equal(deltackpt.load(repo)["w"], torch.load(expected)["w"])
    assert r.verify().ok
    assert "finishing 1 background save(s) before exit" in err, err   # and it said why it did not exit at once
