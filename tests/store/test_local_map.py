"""A local file mapped for one read (deltackpt/store/local_map.py): views of pages the kernel holds
or reads in for them, never past the size the file had (nor its end now), and closing while a
view is held frees nothing early."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import deltackpt
from deltackpt.store import local_map
from deltackpt.store.local import LocalStore
from deltackpt.store.local_map import FileMapping
from tests.conftest import evict_or_skip, resident_pages

pytestmark = pytest.mark.skipif(not os.sys.platform.startswith("linux"), reason="mincore is Linux's")


def _file(path, size: int) -> bytes:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return data


def _mapping(path) -> FileMapping:
    fd = os.open(path, os.O_RDONLY)
    try:
        m = FileMapping.open(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    assert m is not None
    return m


def test_views_are_read_only_and_cut_at_the_file_s_end(tmp_path):
    path = tmp_path / "f"
    data = _file(path, 1 << 20)
    m = _mapping(path)
    try:
        assert bytes(m.view(4096 + 5, 10_000)) == data[4096 + 5:4096 + 5 + 10_000]
        assert bytes(m.view((1 << 20) - 100, 4096)) == data[-100:]
        assert m.view(1 << 20, 10) is None and m.view(-1, 10) is None
        assert m.view(0, 1 << 20).readonly
    finally:
        m.close()


def test_pages_the_kernel_dropped_are_read_in_for_a_view(tmp_path):
    """A cold range is read into the page cache by the view itself (MADV_POPULATE_READ), so the
    caller needs no buffer of its own; only the pages asked for come in with it, give or take
    the kernel's read-ahead."""
    path = tmp_path / "f"
    data = _file(path, 8 << 20)
    evict_or_skip([path])
    m = _mapping(path)
    try:
        assert m.view(3 << 20, 1 << 20, read_in=False) is None   # only what is in memory
        view = m.view(3 << 20, 1 << 20)
        if not local_map._reads_in():
            pytest.skip("this kernel cannot read pages in without touching them (Linux < 5.14)")
        assert view is not None and resident_pages(path) >= 256
        assert bytes(view) == data[3 << 20:4 << 20]
        view.release()
    finally:
        m.close()


def test_without_read_in_views_are_only_of_pages_in_memory(tmp_path, monkeypatch):
    """A kernel without MADV_POPULATE_READ: a range not all in memory gets None (the caller reads
    it with preadv), a page read back gets a view."""
    monkeypatch.setattr(local_map, "_reads_in", lambda: False)
    path = tmp_path / "f"
    data = _file(path, 1 << 20)
    evict_or_skip([path])
    m = _mapping(path)
    try:
        assert m.view(0, 1 << 20) is None
        with open(path, "rb") as f:
            f.seek(8192)
            f.read(4096)   # one page back in memory: a view of it alone, none of a range around it
        assert bytes(m.view(8192, 4096)) == data[8192:12288]
        assert m.view(4096, 3 * 4096) is None
    finally:
        m.close()


_TRUNCATED_CHILD = """
import os, sys
from deltackpt.store import local_map
from deltackpt.store.local_map import FileMapping
from tests.conftest import evict_or_skip, resident_pages
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
m = FileMapping.open(fd, os.fstat(fd).st_size)
os.close(fd)
os.truncate(path, 64 << 10)   # another program cuts the file while it is mapped
print(m.view(512 << 10, 64 << 10) is None, local_map._reads_in(), bytes(m.view(0, 16)).hex())
m.close()
"""


def test_a_range_past_the_end_of_a_file_cut_while_mapped_is_refused_not_signalled(tmp_path):
    """Reading in a page past the file's new end fails the call, where touching it would kill the
    process with SIGBUS (a child process: a signal there fails this test, not the run)."""
    path = tmp_path / "f"
    data = _file(path, 1 << 20)
    evict_or_skip([path])
    out = subprocess.run([sys.executable, "-c", _TRUNCATED_CHILD, str(path)], capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(deltackpt.__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    refused, populates, head = out.stdout.split()
    if populates != "True":
        pytest.skip("this kernel cannot read pages in without touching them (Linux < 5.14)")
    assert refused == "True" and head == data[:16].hex()


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
