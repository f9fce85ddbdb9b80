"""LocalStore's streaming writer fdatasyncs in the background as it goes; the final fsync still
decides durability, and an error the background sync saw is not lost."""

from __future__ import annotations

import errno
import os

import pytest

from deltackpt.errors import StoreError
from deltackpt.store import LocalStore
from deltackpt.store import local, local_writer


def test_streamed_file_with_background_syncs_commits_whole(tmp_path, monkeypatch):
    """A file written in many parts, crossing the writeback threshold often, commits byte for byte."""
    monkeypatch.setattr(local_writer, "WRITEBACK_BYTES", 1000)
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(local.os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    store = LocalStore(tmp_path / "repo")
    w = store.writer(site="pack")
    parts = [bytes([i]) * 700 for i in range(40)]
    for p in parts:
        w.write(p)
    w.commit("packs/ab/x")
    assert store.get("packs/ab/x") == b"".join(parts)
    assert calls, "no background fdatasync ran"
    assert store.list("tmp/") == []


def test_background_sync_error_fails_the_commit(tmp_path, monkeypatch):
    """An EIO seen only by a background fdatasync makes commit raise and leaves no file in place."""
    monkeypatch.setattr(local_writer, "WRITEBACK_BYTES", 100)

    def failing(fd):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(local.os, "fdatasync", failing)
    store = LocalStore(tmp_path / "repo")
    w = store.writer(site="pack")
    w.write(b"x" * 500)
    with pytest.raises(StoreError):
        w.commit("packs/ab/y")
    assert not store.exists("packs/ab/y")
    assert store.list("tmp/") == []


def test_abort_waits_for_the_background_sync(tmp_path, monkeypatch):
    """Aborting with a background fdatasync in flight removes the temp file and raises nothing."""
    monkeypatch.setattr(local_writer, "WRITEBACK_BYTES", 100)
    store = LocalStore(tmp_path / "repo")
    w = store.writer(site="pack")
    w.write(b"y" * 500)
    w.abort()
    assert store.list("tmp/") == []
