"""LocalStore.prefetch brings the whole range it is given into the page cache, however long it is:
Linux fetches at most max(read_ahead_kb, max_sectors_kb) of one ``posix_fadvise(WILLNEED)`` and
drops the rest, so a long range is hinted a piece at a time."""

from __future__ import annotations

import os
import time

import pytest

from bench.common import coldcache
from deltackpt.store import LocalStore


def test_a_long_prefetch_brings_the_whole_range_into_the_page_cache(tmp_path):
    """A 64 MiB range hinted in one call is in the page cache soon after, every page of it (one
    WILLNEED of the whole range fetched its first 8 MiB on the project machine)."""
    store = LocalStore(tmp_path / "repo")
    size = 64 << 20
    store.put_atomic("packs/ab/x", os.urandom(size))   # fsynced: its pages are clean, so droppable
    path = store._path("packs/ab/x")
    coldcache.drop([path])
    if coldcache.resident_bytes([path]) > size // 16:
        pytest.skip("this filesystem keeps the file in memory (tmpfs?): nothing to fetch")
    store.prefetch("packs/ab/x", 0, size)
    deadline = time.monotonic() + 30   # the reads are the kernel's, in the background
    while coldcache.resident_bytes([path]) < size and time.monotonic() < deadline:
        time.sleep(0.05)
    assert coldcache.resident_bytes([path]) == size
