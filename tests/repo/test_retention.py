"""Retention rules: refused when malformed (before gc touches anything), and "last" follows the
history of ``latest``, not the writers' clocks."""

from __future__ import annotations

import os
import time
import types

import pytest
import torch

import deltackpt
from deltackpt.errors import InvalidArgumentError
from deltackpt.repo.write import saver
from tests.conftest import file_digests, run_cli

DAY = 86400.0




def _save(path: str, i: int, *, clock_offset: float = 0.0, monkeypatch=None) -> deltackpt.Version:
    """Save version ``i`` as a writer whose clock is ``clock_offset`` seconds off (only the time the
    saver records is skewed: the rest of the process keeps the real clock)."""
    if clock_offset:
        monkeypatch.setattr(saver, "time", types.SimpleNamespace(time=lambda: time.time() + clock_offset,
                                                                 perf_counter=time.perf_counter))
    try:
        return deltackpt.save({"w": torch.full((32, 32), float(i)), "step": i}, path, step=i,
                              metrics={"loss": float(10 - i)})
    finally:
        if clock_offset:
            monkeypatch.undo()


BAD = {
    "keep_within_nan": dict(keep_within=float("nan")),
    "keep_within_str": dict(keep_within="3600"),
    "keep_within_negative": dict(keep_within=-1.0),
    "keep_within_inf": dict(keep_within=float("inf")),
    "keep_within_bool": dict(keep_within=True),
    "keep_last_str": dict(keep_last="2"),
    "keep_last_float": dict(keep_last=2.5),
    "keep_last_bool": dict(keep_last=True),
    "keep_last_negative": dict(keep_last=-1),
    "keep_every_zero": dict(keep_every=0),
    "keep_every_str": dict(keep_every="10"),
    "keep_best_negative": dict(keep_best=("loss", -1, "min")),
    "keep_best_direction": dict(keep_best=("loss", 1, "up")),
    "keep_best_no_count": dict(keep_best="loss"),
    "keep_best_empty_metric": dict(keep_best=":2"),
    "keep_best_not_a_rule": dict(keep_best=5),
    "keep_best_float_count": dict(keep_best=("loss", 1.5, "min")),
    "keep_tags_str": dict(keep_tags="no"),
    "grace_nan": dict(keep_last=1, grace_seconds=float("nan")),
    "grace_str": dict(keep_last=1, grace_seconds="60"),
    "grace_negative": dict(keep_last=1, grace_seconds=-5),
    "dry_run_str": dict(keep_last=1, dry_run="no"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_retention_is_refused_before_gc_touches_the_repository(repo_path, name):
    """gc with a malformed rule (NaN, a str, a negative count, ...) raises InvalidArgumentError (a
    ValueError and a TypeError too) and the repository keeps every byte and version."""
    for i in range(3):
        _save(repo_path, i)
    before = file_digests(repo_path)
    with pytest.raises(InvalidArgumentError) as info:
        deltackpt.gc(repo_path, **BAD[name])
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
    assert file_digests(repo_path) == before
    assert len(deltackpt.Repo(repo_path).log()) == 3


def test_a_nan_keep_within_in_a_checkpointer_is_refused_when_made(repo_path):
    """Retention(keep_within=nan) fails when constructed, so a Checkpointer never runs gc with it."""
    with pytest.raises(InvalidArgumentError, match="keep_within"):
        deltackpt.Retention(keep_within=float("nan"))
    with pytest.raises(InvalidArgumentError, match="grace_seconds"):
        deltackpt.Checkpointer(repo_path, retention=deltackpt.Retention(keep_last=1), grace_seconds=float("nan"))
    assert not os.path.exists(repo_path)


def test_cli_refuses_a_nan_keep_within_and_removes_nothing(repo_path):
    """`deltackpt gc --keep-within nan` exits 2 with the rule named, and removes nothing."""
    for i in range(3):
        _save(repo_path, i)
    before = file_digests(repo_path)
    proc = run_cli("gc", "--keep-within", "nan", "--grace", "0", "--repo", repo_path, check=False)
    assert proc.returncode == 2 and "keep_within" in proc.stderr, (proc.returncode, proc.stderr)
    assert file_digests(repo_path) == before


def _skewed_series(repo_path: str, monkeypatch) -> list[deltackpt.Version]:
    """v0, v1 by a writer with a good clock; v2 by one whose clock is a day behind; v3 good again."""
    return [_save(repo_path, 0), _save(repo_path, 1),
            _save(repo_path, 2, clock_offset=-DAY, monkeypatch=monkeypatch), _save(repo_path, 3)]


def test_keep_last_follows_history_not_a_skewed_clock(repo_path, monkeypatch):
    """keep_last=2 keeps latest and latest~1 even when latest~1 was saved by a writer whose clock
    was a day behind (by timestamps it would look the oldest and be removed)."""
    vs = _skewed_series(repo_path, monkeypatch)
    assert vs[2].time < vs[0].time   # the skew is real: by the clock v2 is the oldest
    repo = deltackpt.Repo(repo_path)
    assert repo.resolve("latest~1").id == vs[2].id
    report = deltackpt.gc(repo_path, keep_last=2, keep_tags=False, grace_seconds=0)
    assert set(report.kept) == {vs[3].id, vs[2].id}
    assert sorted(report.removed) == sorted([vs[0].id, vs[1].id])
    assert torch.equal(deltackpt.load(repo_path, "latest~1")["w"], torch.full((32, 32), 2.0))
    assert repo.verify().ok


def test_cli_keep_last_follows_history_not_a_skewed_clock(repo_path, monkeypatch):
    """`deltackpt gc --keep-last 2` keeps latest~1 saved with a clock a day behind."""
    vs = _skewed_series(repo_path, monkeypatch)
    run_cli("gc", "--keep-last", "2", "--grace", "0", "--repo", repo_path)
    assert {v.id for v in deltackpt.Repo(repo_path).log()} == {vs[3].id, vs[2].id}


def test_keep_every_picks_the_first_version_of_each_bucket_in_history(repo_path, monkeypatch):
    """keep_every keeps the earliest version in history of each step bucket, whatever its writer's clock said."""
    vs = _skewed_series(repo_path, monkeypatch)   # steps 0..3; v2's clock a day behind
    report = deltackpt.gc(repo_path, keep_last=0, keep_every=4, keep_tags=False, dry_run=True)
    assert set(report.kept) == {vs[0].id, vs[3].id}   # one bucket, steps 0..3: its first is v0 (not v2); latest
