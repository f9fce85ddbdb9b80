"""A local file mapped for one read (deltackpt/store/local_map.py): views only of pages the kernel
holds, never past the size the file had, and closing while a view is held frees nothing early."""

from __future__ import annotations

import os

import numpy as np
import pytest

from deltackpt.store.local import LocalStore
from deltackpt.store.local_map import FileMapping

pytestmark = pytest.mark.skipif(not os.sys.platform.startswith("linux"), reason="mincore is Linux's")


def _file(path, size: int) -> bytes:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return data


def _evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _mapping(path) -> FileMapping:
    fd = os.open(path, os.O_RDONLY)
    try:
        m = FileMapping.open(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    assert m is not None
    return m


def test_views_of_pages_in_memory_and_none_of_others(tmp_path):
    path = tmp_path / "f"
    data = _file(path, 1 << 20)
    m = _mapping(path)
    try:
        assert bytes(m.view(4096 + 5, 10_000)) == data[4096 + 5:4096 + 5 + 10_000]
        assert bytes(m.view((1 << 20) - 100, 4096)) == data[-100:]   # cut at the file's end
        assert m.view(1 << 20, 10) is None and m.view(-1, 10) is None
        assert m.view(0, 1 << 20).readonly
    finally:
        m.close()
    _evict(path)   # (pages this process still mapped would stay)
    m = _mapping(path)
    try:
        if m.view(0, 1 << 20) is not None:
            pytest.skip("this filesystem keeps the file's pages after POSIX_FADV_DONTNEED")
        with open(path, "rb") as f:
            f.seek(8192)
            f.read(4096)   # one page back in memory: a view of it alone, none of a range around it
        assert bytes(m.view(8192, 4096)) == data[8192:12288]
        assert m.view(4096, 3 * 4096) is None
    finally:
        m.close()


def test_closing_while_a_view_is_held_keeps_its_bytes(tmp_path):
    path = tmp_path / "f"
    data = _file(path, 3 * 4096 + 7)
    m = _mapping(path)
    view = m.view(0, len(data))
    m.close()
    assert bytes(view) == data
    view.release()


def test_the_local_store_maps_only_regular_files_inside_it(tmp_path):
    store = LocalStore(tmp_path)
    (tmp_path / "packs").mkdir()
    _file(tmp_path / "packs" / "a", 5000)
    (tmp_path / "packs" / "empty").write_bytes(b"")
    os.symlink(tmp_path / "packs" / "a", tmp_path / "packs" / "link")
    m = store.map_value("packs/a")
    assert m is not None and len(m.view(0, 10_000)) == 5000
    m.close()
    assert store.map_value("packs/empty") is None    # nothing to map: the read path reports
    assert store.map_value("packs/link") is None     # symbolic links are refused, as reads refuse them
    assert store.map_value("packs/missing") is None


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_released_pages_leave_the_resident_set_and_read_back_unchanged(tmp_path):
    """A read that is done with a range gives its pages back (a load would otherwise hold every
    pack page it decoded beside the state); a view still reading them faults them back in."""
    path = tmp_path / "f"
    data = _file(path, 16 << 20)
    m = _mapping(path)
    try:
        view = m.view(0, len(data))
        assert bytes(view) == data   # every page touched: in this process's resident set
        touched = _rss_file_kib()
        m.release(0, len(data))
        assert touched - _rss_file_kib() >= 12 << 10
        assert bytes(view) == data
        view.release()
    finally:
        m.close()


def test_a_release_after_close_advises_nothing(tmp_path, monkeypatch):
    """The addresses of a closed mapping may hold another mapping by then: never advised."""
    from deltackpt import libc
    path = tmp_path / "f"
    _file(path, 1 << 20)
    calls = []
    monkeypatch.setattr(libc, "madvise", lambda *a: calls.append(a) or 0)
    m = _mapping(path)
    m.release(0, 4096)
    assert len(calls) == 1
    m.close()
    m.release(0, 4096)
    assert len(calls) == 1
