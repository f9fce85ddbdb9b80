"""LocalStore's streaming writer writes a file that fills its stage past the page cache
(O_DIRECT, a stage at a time, the unaligned tail through the cache) and a smaller one through the
cache; either way the file holds exactly the bytes given, in writes of any size."""

from __future__ import annotations

import contextlib
import os
import random
from typing import Iterator

import pytest

from bench.common import coldcache
from deltackpt.store import LocalStore, staged_write


def _write(store: LocalStore, key: str, data: bytes, seed: int) -> None:
    rng = random.Random(seed)
    w = store.writer(site="pack")
    pos = 0
    while pos < len(data):   # odd sizes: writes straddle the stage's end and the 4 KiB alignment
        n = rng.choice((1, 7, 4095, 4097, 65536 + 3, 1 << 20, 3 << 20))
        w.write(memoryview(data)[pos:pos + n])
        pos += n
    w.commit(key)


@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE at ``limit`` bytes for the block, SIGXFSZ ignored: a write past it is cut
    short or refused with EFBIG, as on a real quota, instead of killing the process."""
    import resource
    import signal

    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def _direct_refused(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        return True
    os.close(fd)
    return not getattr(os, "O_DIRECT", 0)


@pytest.mark.parametrize("mib", [3, 21])
def test_a_file_written_in_any_pieces_holds_exactly_its_bytes(tmp_path, mib):
    """3 MiB (under a stage: through the page cache) and 21 MiB (five stages written directly by
    the stage thread, the last 1 MiB as an aligned head and a tail), in writes of 1 byte to 3 MiB."""
    store = LocalStore(tmp_path / "repo")
    data = os.urandom((mib << 20) + 1234)
    _write(store, "packs/ab/x", data, seed=mib)
    assert store.get("packs/ab/x") == data
    assert store.list("tmp/") == []


def test_a_large_file_is_written_past_the_page_cache_and_a_small_one_through_it(tmp_path, monkeypatch):
    """Right after the commit, a 21 MiB file has at most its last 4 KiB in the page cache, a 3 MiB
    one every page; with DELTACKPT_DIRECT_IO=0 the large one is cached whole too."""
    store = LocalStore(tmp_path / "repo")
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 4096)
    if _direct_refused(str(probe)):
        pytest.skip("this file system refuses O_DIRECT (tmpfs?): every write goes through the cache")
    big, small = os.urandom((21 << 20) + 1234), os.urandom(3 << 20)
    _write(store, "packs/ab/big", big, seed=1)
    _write(store, "packs/ab/small", small, seed=2)
    assert coldcache.resident_bytes([store._path("packs/ab/big")]) <= 4096
    assert coldcache.resident_bytes([store._path("packs/ab/small")]) == len(small)
    monkeypatch.setenv("DELTACKPT_DIRECT_IO", "0")
    _write(store, "packs/ab/cached", big, seed=3)
    assert coldcache.resident_bytes([store._path("packs/ab/cached")]) >= len(big) - 4096
    assert store.get("packs/ab/big") == big and store.get("packs/ab/cached") == big
    assert staged_write.STAGE_BYTES == 4 << 20   # the sizes above straddle it


def test_a_stage_the_thread_fails_to_write_fails_the_file_and_leaves_nothing(tmp_path):
    """A write the stage thread gets refused (a file size limit: EFBIG past 10 MiB) is raised by
    the writer's next write or its seal, as a StoreError naming the file, and no temp is left."""
    from deltackpt.errors import StoreError

    store = LocalStore(tmp_path / "repo")
    with _file_size_limit(10 << 20):
        w = store.writer(site="pack")
        with pytest.raises(StoreError) as err:
            for _ in range(8):   # 32 MiB in 4 MiB writes: the third stage crosses the limit
                w.write(os.urandom(4 << 20))
            w.commit("packs/ab/x")
    assert "File too large" in str(err.value), err.value
    assert store.list("tmp/") == [] and not store.exists("packs/ab/x")


def test_one_thread_writes_every_stage_of_a_file_and_is_joined_by_the_commit(tmp_path, monkeypatch):
    """A 21 MiB file fills five stages: one writing thread takes them all (a thread per stage made
    a first save of 260 MB start 39 threads), and none is left once the commit returns."""
    import threading
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self):
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    store = LocalStore(tmp_path / "repo")
    data = os.urandom((21 << 20) + 1234)
    _write(store, "packs/ab/x", data, seed=3)
    writers = [n for n in started if n.startswith("deltackpt-stage-write")]
    assert len(writers) == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("deltackpt-stage-write")]
    assert store.get("packs/ab/x") == data


def test_a_small_file_is_written_from_the_given_bytes_without_a_copy(tmp_path):
    """Under a stage, a file is written straight from the views it was given (one pwritev at the
    commit): writing 3 MiB faults in no fresh stage pages (a copy through a stage faulted 768)."""
    import resource

    store = LocalStore(tmp_path / "repo")
    data = os.urandom(3 << 20)
    parts = [memoryview(data)[i:i + (64 << 10) + 7] for i in range(0, len(data), (64 << 10) + 7)]
    w = store.writer(site="pack")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for part in parts:
        w.write(part)
    w.commit("packs/ab/x")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 256, faults
    assert store.get("packs/ab/x") == data


def test_a_file_of_many_tiny_parts_is_copied_into_a_stage_and_holds_its_bytes(tmp_path):
    """More parts than one pwritev takes (HELD_VIEWS): the held ones are copied into a stage and
    the file is written from it, every byte in order."""
    store = LocalStore(tmp_path / "repo")
    data = os.urandom(staged_write.HELD_VIEWS * 3 * 7 + 5)
    w = store.writer(site="pack")
    for i in range(0, len(data), 7):
        w.write(memoryview(data)[i:i + 7])
    w.commit("packs/ab/x")
    assert store.get("packs/ab/x") == data


def test_a_short_write_of_a_small_file_goes_on_mid_part_and_its_failure_leaves_nothing(tmp_path):
    """A file size limit of 1 MiB + 100 bytes: the pwritev of a 3 MiB file is cut inside a part,
    the write goes on from there and the kernel then refuses it (EFBIG): a StoreError naming the
    file, no temp left, nothing published."""
    from deltackpt.errors import StoreError

    store = LocalStore(tmp_path / "repo")
    data = os.urandom(3 << 20)
    w = store.writer(site="pack")
    for i in range(0, len(data), 1 << 19):
        w.write(memoryview(data)[i:i + (1 << 19)])
    with _file_size_limit((1 << 20) + 100), pytest.raises(StoreError) as err:
        w.commit("packs/ab/x")
    assert "File too large" in str(err.value), err.value
    assert store.list("tmp/") == [] and not store.exists("packs/ab/x")


def test_files_written_in_turn_share_their_stages_through_a_pool(tmp_path):
    """Three 13 MiB files written one after another with one StagePool map two stages in all,
    not two each: the second and third fault in no fresh stage pages (2,048 a file without the
    pool), and each holds exactly its bytes.  Once the pool is closed a file still writes, with
    stages of its own that its close unmaps."""
    import resource

    store = LocalStore(tmp_path / "repo")
    pool = staged_write.StagePool()
    datas = [os.urandom((13 << 20) + 777 * i) for i in range(3)]

    def write(key: str, data: bytes, stages: "staged_write.StagePool | None") -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        w = store.writer(site="pack", stages=stages)
        for i in range(0, len(data), 1 << 20):
            w.write(memoryview(data)[i:i + (1 << 20)])
        w.commit(key)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    write("packs/ab/0", datas[0], pool)
    later = [write(f"packs/ab/{i}", datas[i], pool) for i in (1, 2)]
    assert pool.mapped == 2
    assert max(later) < 1024, later
    unpooled = write("packs/ab/3", datas[0], None)
    assert unpooled > 1024, unpooled   # the fresh stages a file maps without one (the check can fail)
    pool.close()
    write("packs/ab/4", datas[1], pool)
    assert pool.mapped == 4
    for i, data in enumerate([*datas, datas[0], datas[1]]):
        assert store.get(f"packs/ab/{i}") == data
    assert store.list("tmp/") == []
