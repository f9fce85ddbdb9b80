"""Shared fixtures.  Hypothesis profile: DELTACKPT_HYPOTHESIS=default|ci|nightly (CI sets ci)."""

from __future__ import annotations

import gc
import getpass
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("nightly", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("DELTACKPT_HYPOTHESIS", "ci" if os.environ.get("CI") else "default"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a save deltifies older versions after it commits (a bounded step, inline); tests that
# count packs, bytes or objects expect a save's own writes, so the suite (and the processes it
# starts) turns that off and deltifies on purpose (tests/repo/test_deltify.py turns it on)
os.environ["DELTACKPT_DELTIFY"] = "off"
# a shell that starts pytest in the background (`make test &`, nohup) leaves SIGINT ignored, and a
# child inherits that: the tests that press Ctrl-C on a child would then see nothing happen.  With
# a Python handler here, a child starts with the default disposition, as it would from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# transformers' model classes touch torch's compile cache, whose default folder,
# <temp>/torchinductor_<user>, would outlive the suite: the suite and the processes it starts use
# a folder of their own, made in pytest_configure (a run pytest refuses for its arguments never
# gets to pytest_unconfigure, and left one behind when it was made at import) and removed at the end
_COMPILE_CACHE: str | None = None


def pytest_configure(config):
    global _COMPILE_CACHE
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        _COMPILE_CACHE = tempfile.mkdtemp(prefix="deltackpt-tests-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _COMPILE_CACHE


# pytest's own root for tmp_path, <temp>/pytest-of-<user>: a passing run leaves it empty
# (tmp_path_retention_policy), and the suite removes it too when this run made it
_PYTEST_ROOT = os.path.join(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir(),
                            f"pytest-of-{getpass.getuser()}")
_PYTEST_ROOT_WAS_THERE = os.path.exists(_PYTEST_ROOT)


def pytest_unconfigure(config):
    if _COMPILE_CACHE:
        shutil.rmtree(_COMPILE_CACHE, ignore_errors=True)
    if not _PYTEST_ROOT_WAS_THERE:
        try:
            os.rmdir(_PYTEST_ROOT)   # only when empty: a failed test's files stay to be read
        except OSError:
            pass


#: The second tier (marker ``reliability``): `make test` leaves it out to stay within 6 minutes on
#: 2 cores; `make test-reliability` and CI run it, on the same deterministic sample (`make
#: reliability` runs the crash suites exhaustively).  A node id prefix -> why it is here.  The
#: first tier is the library's contract: unit tests and small integration tests.
SECOND_TIER = {
    "tests/reliability/": "crash matrices: kills at every I/O step, power cuts, disk full, concurrent writers",
    "tests/scale/": "large states",
    "tests/security/test_special_files.py": "FIFOs and sparse 1 GiB-1 TiB files, a process per probe",
    "tests/security/test_nested_manifests.py": "states nested 200 to 20,000 deep, 4 MiB manifests",
    "tests/snapshot/test_exit.py": "scripts signalled or ending with a background save pending",
    "tests/snapshot/test_encoder_process.py::test_ctrl_c_to_the_process_group": "Ctrl-C matrix",
    "tests/store/test_s3_repo.py::test_sigkill_during_upload": "kills during an upload to a moto server",
    "tests/store/test_s3_repo.py::test_committer_whose_refs_lock_was_broken": "a stalled writer on S3",
    "tests/training/test_guard_crash.py": "SIGKILL of a guarded run, then resume",
    "tests/training/test_guard_sustained.py": "real MiniLM fine-tunes diverging (the bench extra's model)",
    "tests/training/test_training.py::test_sigkill_and_resume": "SIGKILL of a training run, then resume",
    "tests/repo/test_dead_save_leftovers.py": "saves killed mid-write",
    "tests/repo/test_spec_findings.py::test_a_manifest_declaring_an_impossible_blob": "a 1-million-chunk manifest",
    "tests/cli/test_cli_refusals.py::test_diff_of_stride0_views": "2^36-element views",
    "tests/cli/test_cli_errors.py::test_export_of_a_huge_stride0_view": "2^36-element views",
    "tests/api/test_deep_states.py::test_the_cli_shows_diffs_and_restores_a_state_as_deep": "a state 20,000 deep",
    "tests/integrations/test_lightning_conformance.py::test_ddp_spawn": "a two-process DDP run",
    "tests/integrations/test_examples.py": "the example scripts, end to end",
    "tests/test_docs_snippets.py::test_page_runs_as_written": "every page's code, framework training runs included",
    "tests/docs/": "a documentation page's code",
    "tests/test_core_only.py::test_demo_runs_with_only_the_core": "the demo (make demo runs it too)",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(tuple(SECOND_TIER)):
            item.add_marker(pytest.mark.reliability)


@pytest.fixture
def repo_path(tmp_path):
    """A path for a fresh repository (created on first save)."""
    return str(tmp_path / "repo")


def _open_files() -> dict[int, str]:
    """This process's open file descriptors that name a temp file or a shared-memory segment."""
    out = {}
    tmp = tempfile.gettempdir()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue   # closed meanwhile (the listing's own descriptor)
        if target.startswith((tmp + "/", "/memfd:")):
            out[int(fd)] = target
    return out


@pytest.fixture(autouse=True)
def _nothing_left_running():
    """Every test leaves no deltackpt thread alive and no file of its own open, as frameworks check
    their plugins (Lightning's conftest fails a test that leaves a thread behind): a handle's
    close(), a blocking save's return and a background save's wait() end everything they started."""
    threads_before = set(threading.enumerate())
    files_before = _open_files()
    yield
    left = [t.name for t in threading.enumerate()
            if t not in threads_before and t.is_alive() and t.name.startswith("deltackpt")]
    files = {fd: t for fd, t in _open_files().items() if files_before.get(fd) != t}
    if left or files:
        gc.collect()   # a handle nobody closed, dropped by the test: its memory goes, its threads must not
        files = {fd: t for fd, t in _open_files().items() if files_before.get(fd) != t}
        left = [t.name for t in threading.enumerate()
                if t not in threads_before and t.is_alive() and t.name.startswith("deltackpt")]
    assert not left, f"test left deltackpt threads running: {left}"
    assert not files, f"test left files open: {sorted(files.values())[:5]}"


def drain_background() -> None:
    """Collect every background save of this process still in flight or uncollected (a test's
    teardown: what a failed save left for the next save must not leak into the next test)."""
    from deltackpt.snapshot import at_exit
    for runtime in at_exit.runtimes():
        try:
            runtime.drain()
        except BaseException:  # noqa: BLE001 - the test asserted what it expected of it
            pass


@pytest.fixture
def inject(monkeypatch):
    """``inject(spec)`` arms the project's fault hook in this process with ``spec`` (what
    DELTACKPT_FAULT arms in a child: ``site:nth:action``, deltackpt/faults.py); at teardown, what a
    failed background save left uncollected is drained."""
    from deltackpt import faults

    def arm(spec: str) -> None:
        monkeypatch.setattr(faults, "_SPEC", spec)
        monkeypatch.setattr(faults, "ACTIVE", True)
        monkeypatch.setattr(faults, "_counts", {})
    yield arm
    drain_background()


def run_cli(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real ``deltackpt`` command in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "deltackpt.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"deltackpt {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def file_digests(root: str) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha1 of its bytes): equal before and after means
    an operation wrote nothing."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for n in files:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = hashlib.sha1(f.read()).hexdigest()
    return out


def proc_state(pid: int) -> str:
    """The one-letter state of process ``pid`` (``T`` stopped, ``Z`` zombie, ...), or ``"gone"``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def resident_pages(path) -> int:
    """How many of the file's pages the kernel holds (mincore over a mapping of the test's own)."""
    import mmap

    import numpy as np

    from deltackpt import libc
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        probe = np.frombuffer(mm, dtype=np.uint8, count=1)
        vec = np.empty(-(-size // mmap.PAGESIZE), dtype=np.uint8)
        assert libc.mincore(probe.ctypes.data, size, vec.ctypes.data) == 0
        del probe
        return int(np.bitwise_and(vec, 1).sum())
    finally:
        mm.close()


def evict_or_skip(paths) -> None:
    """Drop the files' pages from the page cache (they are clean: written with fsync), or skip the
    test where the filesystem keeps them."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if any(resident_pages(p) for p in paths):
        pytest.skip("this filesystem keeps a file's pages after POSIX_FADV_DONTNEED")
