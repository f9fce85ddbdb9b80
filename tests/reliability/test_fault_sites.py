"""Items 1 and 7 of issue 5: SIGKILL, ENOSPC, EIO and short writes at every I/O site of a first save,
an incremental save, a tag and a gc, enumerated with the fault trace."""

from __future__ import annotations

import os
import time

import pytest
from harness import FULL, occurrences, record, sample, trace_sites
from workloads import WORKLOADS, fresh_copy, job_for, judge, make_template

pytestmark = pytest.mark.reliability

_SITES: dict[str, tuple] = {}


def _setup(zygote, tmp_path_factory, workload):
    if workload not in _SITES:
        base = str(tmp_path_factory.mktemp(f"sites-{workload}"))
        t = make_template(zygote, workload, base)
        wl, job = job_for(workload)
        sites = trace_sites(zygote, tmp_path_factory.mktemp("trace"), wl, fresh_copy(t, os.path.join(base, "trace")),
                            **job)
        _SITES[workload] = (t, occurrences(sites))
    return _SITES[workload]


def _final_names_are_whole(repo: str) -> None:
    """No partial object under a final name: every pack, index file and manifest hashes to its name."""
    from deltackpt.format.ids import hex_id
    for sub in ("packs", "index", "manifests"):
        for dirpath, _, files in os.walk(os.path.join(repo, sub)):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    assert hex_id(f.read()) == name, f"{sub}/{name} does not hash to its name (partial write)"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_kill_at_every_site(zygote, tmp_path, tmp_path_factory, workload):
    """SIGKILL at each I/O site (sampled in CI, every site in full mode) loses no committed version,
    leaves the interrupted one absent or whole, and the repository verifies, saves and collects after."""
    t, points = _setup(zygote, tmp_path_factory, workload)
    chosen = sample(points, 3, seed=1)
    wl, job = job_for(workload)
    t0 = time.monotonic()
    temps = locks = 0
    for i, (site, n) in enumerate(chosen):
        repo = fresh_copy(t, str(tmp_path / f"p{i}"))
        c = zygote.run(wl, repo, fault=f"{site}:{n}:kill", **job)
        assert c.exit_code == -9, f"kill at {site}#{n} did not fire:\n{c.text()}"
        res = judge(workload, t, repo, c)
        temps += res.leftover_temps
        locks += res.stale_locks
    record(f"kill-sites-{workload}", points=len(chosen), sites_total=len(points), lost=0, torn=0, wrong=0,
           leaked_temps_reclaimed=temps, stale_locks_broken=locks, seconds=round(time.monotonic() - t0, 1))


ERROR_ACTIONS = ("enospc", "eio", "short_write")


@pytest.mark.parametrize("workload", WORKLOADS)
def test_io_errors_at_every_write_and_fsync(zygote, tmp_path, tmp_path_factory, workload):
    """ENOSPC / EIO / a short write at each write, fsync and directory fsync fails the operation with a
    StoreError (never a success), the ref does not move unless the error came after its rename (or link), no
    partial file sits under a final name, and the next save works."""
    t, points = _setup(zygote, tmp_path_factory, workload)
    io_points = [(s, n, a) for s, n in points if s.rsplit(".", 1)[-1] in ("write", "fsync", "dirsync")
                 for a in ERROR_ACTIONS if a != "short_write" or s.endswith(".write")]
    chosen = sample(io_points, 3, seed=2)
    wl, job = job_for(workload)
    # the ref becomes visible at its rename, or at its link when a first save creates it
    ref_rename = [i for i, (s, _) in enumerate(points) if s in ("ref.rename", "ref.link")]
    t0 = time.monotonic()
    for i, (site, n, action) in enumerate(chosen):
        repo = fresh_copy(t, str(tmp_path / f"p{i}"))
        c = zygote.run(wl, repo, fault=f"{site}:{n}:{action}", **job)
        lines = c.lines()
        assert c.exit_code == 0, f"{action} at {site}#{n} crashed the job:\n{c.text()}"
        errors = [ln for ln in lines if ln.startswith("ERROR")]
        if workload == "gc" and action == "enospc" and site.startswith(("lock.gc.", "lock.refs.")):
            # gc on a full disk takes its locks with an empty body and goes on: it is what frees space
            assert not errors and any(ln.startswith("GC ") for ln in lines), f"{action} at {site}#{n}: {lines}"
            judge(workload, t, repo, c)
            continue
        assert errors and errors[0].startswith("ERROR StoreError"), f"{action} at {site}#{n}: {lines}"
        assert "DONE" not in lines and not any(ln.startswith(("TAGGED", "GC")) for ln in lines), \
            f"{action} at {site}#{n} was reported as success: {lines}"
        armed = t.committed + (c.committed()[:1] if workload == "incr" else [])
        assert len(c.committed()) == len(armed) - len(t.committed), f"a failed save printed COMMITTED: {lines}"
        idx = points.index((site, n))
        from deltackpt.repo.repository import Repository
        latest = Repository(repo).latest() if os.path.exists(os.path.join(repo, "config")) else None
        before = armed[-1][0] if armed else None
        if not ref_rename or idx < ref_rename[-1]:
            assert latest == before, f"{action} at {site}#{n} moved the ref"
        _final_names_are_whole(repo)
        judge(workload, t, repo, c)
    record(f"io-errors-{workload}", points=len(chosen), sites_total=len(io_points),
           seconds=round(time.monotonic() - t0, 1))
