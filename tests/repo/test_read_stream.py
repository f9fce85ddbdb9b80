"""A read streams pack spans (deltackpt/repo/read/stream.py): the calling thread reads ahead of the
decode pool into a bounded number of reused buffers, with a bounded prefetch window; a damaged
chunk or a failed read in the middle of the stream still fails typed, naming the version and the
tensor, and leaves no live state half-written where the call promises all or nothing."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import deltackpt
from deltackpt.errors import CorruptObjectError, StoreError
from deltackpt.repo.layout import pack_key
from deltackpt.repo.read.stream import Span, SpanStream
from deltackpt.repo.repository import Repository
from deltackpt.store.base import WrappingStore
from deltackpt.store.local import LocalStore
from tests.api.test_live_restore import _corrupt
from tests.conftest import evict_or_skip


class _Recording(WrappingStore):
    """A local store that records, in order, every span read into a caller's buffer and every
    prefetch hint (the real reads and hints happen)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.events: list[tuple[str, str, int, int]] = []
        self.lock = threading.Lock()

    def read_into(self, key, start, out):
        with self.lock:
            self.events.append(("read", key, start, len(out)))
        return self.inner.read_into(key, start, out)

    def prefetch(self, key, start, length):
        with self.lock:
            self.events.append(("hint", key, start, length))
        self.inner.prefetch(key, start, length)


def _state(tensors: int, numel: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(tensors)
    return {f"t{i:02d}": torch.randn(numel, generator=g) * 0.02 for i in range(tensors)}


def _spans(path: str) -> list[Span]:
    """Every stored object of the repository as a span of its own, in pack order."""
    r = Repository(path)
    return [Span(*s) for s in sorted((pid, e.offset, e.length) for _cid, pid, e in r.index.items())]


def test_the_reader_stays_a_bounded_window_ahead_of_slow_decoders(tmp_path):
    """With decoders far slower than reads, the reader never holds more than ``slots`` spans that
    are not decoded yet, its buffers never exceed ``slots`` spans, and it hints at most ``window``
    bytes (plus one span) beyond the span it reads; every span reaches its decoder intact, once."""
    path = str(tmp_path / "repo")
    with deltackpt.Repo(path, create=True, chunk_bytes=64 << 10) as repo:   # 48 x 4 objects of ~64 KiB
        repo.save(_state(48, 64 << 10))
    spans = _spans(path)
    assert len(spans) >= 40
    store = _Recording(LocalStore(path))
    slots, window, longest = 3, 4 * max(s[2] for s in spans), max(s[2] for s in spans)
    started = finished = 0
    most_ahead = 0
    seen: dict[int, bytes] = {}
    lock = threading.Lock()
    real_read = store.read_into

    def counting_read(key, start, out):
        nonlocal started, most_ahead
        with lock:
            started += 1
            most_ahead = max(most_ahead, started - finished)
        return real_read(key, start, out)
    store.read_into = counting_read

    def decode(i, data):
        nonlocal finished
        time.sleep(0.01)
        seen[i] = bytes(data)
        with lock:
            finished += 1

    stream = SpanStream(store, slots=slots, window=window)
    with ThreadPoolExecutor(2) as pool:
        stream.run(list(range(len(spans))), spans, decode, pool)
    assert most_ahead <= slots
    assert stream.peak_buffer_bytes <= slots * longest
    raw = LocalStore(path)
    assert seen == {i: raw.get(pack_key(s.pack_id), s.start, s.length) for i, s in enumerate(spans)}
    # the prefetch window: bytes hinted beyond the span being read, at each read; a hint may
    # cover several back-to-back spans of one pack
    reads, hints = 0, 0
    order = {(pack_key(s.pack_id), s.start): i for i, s in enumerate(spans)}
    hinted: set[int] = set()
    for kind, key, start, length in store.events:
        if kind == "hint":
            hints += 1
            covered = {j for j, s in enumerate(spans)
                       if pack_key(s.pack_id) == key and start <= s.start and s.start + s.length <= start + length}
            assert sum(spans[j][2] for j in covered) == length, (key, start, length)   # whole spans only
            hinted |= covered
            continue
        i = order[(key, start)]
        reads += 1
        ahead = sum(spans[j][2] for j in hinted if j > i)
        assert ahead <= window + longest, (i, ahead)
    assert reads == len(spans) and hinted == set(range(len(spans)))   # the first too: its pages queue first
    # hinted in batches, not span by span: the thread wakes once per half window read
    assert hints <= 2 + 2 * sum(s[2] for s in spans) // window, hints


class _ColdViews(WrappingStore):
    """A local store whose packs are mapped (as LocalStore maps them), each span dropped from the
    page cache just before the reader looks for it there (the kernel's read-around would bring
    the next spans in with the first), and whose views of spans read in are counted."""

    def __init__(self, root: str, on_view) -> None:
        super().__init__(LocalStore(root))
        self.root, self.on_view = root, on_view

    def map_value(self, key):
        mapping = self.inner.map_value(key)
        if mapping is None:
            return None
        on_view, path = self.on_view, os.path.join(self.root, key)

        class Counted:
            def view(self, start, length, *, read_in=True):
                if not read_in:
                    fd = os.open(path, os.O_RDONLY)
                    os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
                got = mapping.view(start, length, read_in=read_in)
                if got is not None and read_in:
                    on_view()
                return got

            def release(self, start, length):
                mapping.release(start, length)

            def close(self):
                mapping.close()
        return Counted()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is Linux's")
def test_the_reader_holds_at_most_slots_spans_in_place_ahead_of_slow_decoders(tmp_path):
    """A cold span read in place holds its pages in the process until decoded: with decoders far
    slower than the reader, it still never has more than ``slots`` such spans waiting, and every
    span reaches its decoder intact."""
    from deltackpt.store import local_map
    if not local_map._reads_in():
        pytest.skip("this kernel cannot read pages in without touching them (Linux < 5.14)")
    path = str(tmp_path / "repo")
    with deltackpt.Repo(path, create=True, chunk_bytes=64 << 10) as repo:
        repo.save(_state(16, 64 << 10))
    spans = _spans(path)
    evict_or_skip([p for p in (tmp_path / "repo" / "packs").rglob("*") if p.is_file()])
    started = finished = most_ahead = 0
    lock = threading.Lock()

    def viewed():
        nonlocal started, most_ahead
        with lock:
            started += 1
            most_ahead = max(most_ahead, started - finished)

    seen: dict[int, bytes] = {}

    def decode(i, data):
        nonlocal finished
        time.sleep(0.005)
        assert data.readonly   # the pack's own bytes, not a buffer of the stream's
        seen[i] = bytes(data)
        with lock:
            finished += 1

    slots = 3
    stream = SpanStream(_ColdViews(path, viewed), slots=slots, window=1 << 20)
    with ThreadPoolExecutor(2) as pool:
        stream.run(list(range(len(spans))), spans, decode, pool)
    assert len(spans) >= 40 and started >= len(spans) // 2 and most_ahead <= slots   # (a span whose
    # pages a neighbour still maps stays in memory)
    raw = LocalStore(path)
    assert seen == {i: raw.get(pack_key(s.pack_id), s.start, s.length) for i, s in enumerate(spans)}


def test_memory_of_a_load_is_its_tensors_plus_a_bounded_window(tmp_path):
    """The span buffers of a load are a window that does not grow with the state: a 64 MiB load
    holds at most (threads + SPARE_SPANS) spans of READ_SPAN decoded bytes (at most half its size),
    and an 8 MiB load only what it reads."""
    from deltackpt.repo.read import reader
    from deltackpt.repo.read import stream as stream_mod

    peaks = []
    real_run = stream_mod.SpanStream.run

    def recording_run(self, *args, **kwargs):
        try:
            return real_run(self, *args, **kwargs)
        finally:
            peaks.append(self.peak_buffer_bytes)
    stream_mod.SpanStream.run = recording_run
    try:
        for count in (8, 64):
            path = str(tmp_path / f"repo{count}")
            state = _state(count, 1 << 18)   # 1 MiB tensors
            deltackpt.save(state, path)
            got = deltackpt.load(path, threads=2)
            assert all(torch.equal(got[k], v) for k, v in state.items())
    finally:
        stream_mod.SpanStream.run = real_run
    per_object = reader.ROOM_HEAD + reader.ROOM_TAIL + 64   # each object in a room of its own
    assert peaks[0] <= (8 << 20) + 8 * per_object
    assert peaks[1] <= (2 + reader.SPARE_SPANS) * (reader.READ_SPAN + 64 * per_object) <= (64 << 20) // 2


def test_a_damaged_chunk_mid_stream_fails_typed_naming_version_and_tensor(tmp_path):
    """One damaged object among many spans: the load raises CorruptObjectError naming the version
    and the tensor, after every decode it started has finished (no read thread is left)."""
    path = str(tmp_path / "repo")
    state = _state(24, 1 << 18)
    v = deltackpt.save(state, path)
    with deltackpt.Repo(path) as repo:
        m = repo.core.manifest(v.id)
        blob = m.blobs[next(t.blob for t in m.tensors if t.name == "t13")]
        _corrupt(path, repo, blob.chunks[0].chunk_id)
    with pytest.raises(CorruptObjectError, match=rf"version {v.id[:10]}, tensor t13\b"):
        deltackpt.load(path, threads=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("deltackpt-read")]


def test_a_read_error_mid_stream_is_typed_and_names_version_and_tensor(tmp_path, inject):
    """The third span read fails with EIO: load raises a StoreError naming the version and a tensor
    of that span, not a bare OSError, and no read thread is left."""
    path = str(tmp_path / "repo")
    v = deltackpt.save(_state(24, 1 << 18), path)
    inject("read.packs:3:eio")
    with pytest.raises(StoreError, match=rf"version {v.id[:10]}, tensor t\d\d.*injected EIO"):
        deltackpt.load(path, threads=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("deltackpt-read")]


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 512))


def _train(model, opt, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 512)).pow(2).mean().backward()
        opt.step()


def test_a_read_error_mid_stream_leaves_the_live_model_untouched_on_resume(tmp_path, inject):
    """resume() of an older version into a live model and optimizer, with a read failing half way
    through the stream: it raises typed and neither the model nor the optimizer changed a bit."""
    from deltackpt.training import resume

    path = str(tmp_path / "repo")
    model = _mlp(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(model, opt, 2)
    old = deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path, step=2)
    _train(model, opt, 2)
    deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path, step=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {(i, k): t.clone() for i, s in opt.state_dict()["state"].items() for k, t in s.items()}
    with deltackpt.Repo(path) as repo:
        spans = len({pid for _c, pid, _e in repo.core.index.items()})
    inject("read.packs:2:eio")
    with pytest.raises(StoreError, match=rf"version {old.id[:10]}.*injected EIO"):
        resume(path, model=model, optimizer=opt, version=old.id, restore_rng=False)
    assert spans >= 1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    after = opt.state_dict()["state"]
    assert all(torch.equal(after[i][k], t) for (i, k), t in moments.items())


def test_a_live_restore_reads_through_the_stream_and_lands_bit_identical(tmp_path):
    """restore() into a live model decodes in place through the same stream, with every core."""
    path = str(tmp_path / "repo")
    model = _mlp(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(model, opt, 1)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    other = _mlp(2)
    deltackpt.restore(other, path, threads=2, strict=False)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in want.items())
    assert os.path.isdir(path)


def _threads_started(fn) -> set[str]:
    """Names of the threads the threading module started while ``fn()`` ran (each new thread calls
    the profile function threading.setprofile installed, on its first event)."""
    names: set[str] = set()
    lock = threading.Lock()

    def seen(frame, event, arg):
        with lock:
            names.add(threading.current_thread().name)
        sys.setprofile(None)   # one event per thread is enough

    threading.setprofile(seen)
    try:
        fn()
    finally:
        threading.setprofile(None)
    return {n for n in names if n != threading.current_thread().name}


def _four_versions(path: str, state: dict[str, torch.Tensor]) -> None:
    """Four versions, each changing a quarter of the tensors: the newest version's chunks lie in
    four packs, spans a read pool would share."""
    with deltackpt.Repo(path, create=True) as repo:
        for v in range(4):
            for i, t in enumerate(state.values()):
                if i % 4 == v:
                    t.add_(1.0)
            repo.save(state, step=v)


def test_a_small_load_decodes_on_the_calling_thread(tmp_path):
    """A state of 4 MiB (at most materialize.INLINE_LOAD_BYTES, PREFETCH_MIN_BYTES of packs) is
    decoded by the caller: no read pool and no read-ahead thread is started, and it loads
    bit-identically; a state of 24 MiB starts the pool it asks for."""
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    state = _state(16, 1 << 16)    # 16 tensors of 256 KiB
    _four_versions(small, state)
    _four_versions(large, _state(24, 1 << 18))
    got: dict = {}
    started = _threads_started(lambda: got.update(deltackpt.load(small, threads=2)))
    assert not [n for n in started if n.startswith("deltackpt-read")], started
    assert all(torch.equal(got[k], v) for k, v in state.items())
    started = _threads_started(lambda: deltackpt.load(large, threads=2))
    assert [n for n in started if n.startswith("deltackpt-read_")], started


def _pack_reads(monkeypatch) -> list[str]:
    """Every pack key read into a caller's buffer (``LocalStore.read_into``), recorded."""
    keys: list[str] = []
    real = LocalStore.read_into

    def read_into(self, key, start, out):
        if key.startswith("packs/"):
            keys.append(key)
        return real(self, key, start, out)
    monkeypatch.setattr(LocalStore, "read_into", read_into)
    return keys


def _mapped_packs() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if "/packs/" in line]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is Linux's")
def test_warm_and_cold_loads_decode_the_packs_where_they_lie(tmp_path, monkeypatch):
    """Packs the kernel holds are decoded where they lie, and so are packs it dropped: the mapping
    has the kernel read them in (no read into a buffer of ours).  On a kernel that cannot, a cold
    load reads them with preadv.  Every load gives the state, counts the same pack bytes, and
    leaves no pack mapped."""
    from deltackpt.store import local_map
    from deltackpt.store.counting import CountingStore

    path = tmp_path / "repo"
    state = _state(24, 1 << 18)
    deltackpt.save(state, str(path))
    packs = [p for p in (path / "packs").rglob("*") if p.is_file()]
    for p in packs:
        p.read_bytes()
    reads = _pack_reads(monkeypatch)
    counted = []
    for temperature in ("warm", "cold", "cold, no read-in"):
        if temperature != "warm":
            evict_or_skip(packs)
        if temperature == "cold, no read-in":
            monkeypatch.setattr(local_map, "_reads_in", lambda: False)
        store = CountingStore(LocalStore(str(path)))
        got = deltackpt.load(store, threads=2)
        assert all(torch.equal(got[k], v) for k, v in state.items())
        del got
        counted.append(store.bytes_read_under("packs/"))
        if temperature == "warm" or local_map._reads_in():
            assert reads == [], temperature
        else:
            assert reads, temperature
        assert _mapped_packs() == []
    assert counted[0] > 0 and len(set(counted)) == 1


class _MappedAndHinted(WrappingStore):
    """A local store as a load sees it (packs mapped), recording the bytes of every prefetch hint."""

    def __init__(self, root: str) -> None:
        super().__init__(LocalStore(root))
        self.hinted = 0

    def map_value(self, key):
        return self.inner.map_value(key)

    def prefetch(self, key, start, length):
        self.hinted += length
        self.inner.prefetch(key, start, length)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is Linux's")
def test_a_warm_load_hints_one_window_and_a_cold_one_hints_every_span(tmp_path):
    """Hints fetch nothing the page cache holds: after its first window the read-ahead thread
    hints only once the reader has met a span not in memory.  A cold load hints past the first
    window, not necessarily every span: the reader may reach the last spans before the thread
    wakes to hint them, and reads them itself (once in 6 runs here, 35 of 42 MB hinted)."""
    from deltackpt.repo.read.reader import READ_AHEAD
    path = tmp_path / "repo"
    state = _state(48, 1 << 18)   # 48 MiB of noise: ~3 windows of packs
    deltackpt.save(state, str(path))
    packs = [p for p in (path / "packs").rglob("*") if p.is_file()]
    stored = sum(p.stat().st_size for p in packs)
    assert stored > 2 * READ_AHEAD
    for p in packs:
        p.read_bytes()
    warm = _MappedAndHinted(str(path))
    got = deltackpt.load(warm, threads=2)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    del got
    evict_or_skip(packs)
    cold = _MappedAndHinted(str(path))
    got = deltackpt.load(cold, threads=2)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert warm.hinted <= READ_AHEAD < cold.hinted, (warm.hinted, cold.hinted, stored)


_PEAK_CHILD = """
import sys
import deltackpt
from deltackpt.repo.read import stream
if sys.argv[2] == "keep":
    stream.RELEASE_BATCH = 1 << 62
def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))
deltackpt.load(sys.argv[1], threads=2)   # imports and the first allocations out of the figure
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")   # the peak starts again from here
before = kib("VmRSS")
state = deltackpt.load(sys.argv[1], threads=2)
print(kib("VmHWM") - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is Linux's")
def test_a_warm_load_holds_little_of_the_packs_beside_its_tensors(tmp_path):
    """Mapped spans leave the resident set as they are decoded: a warm load of a 96 MiB state
    grows the process by the state and a bounded window, where keeping the packs mapped until
    the end would hold them all beside it."""
    import subprocess

    path = str(tmp_path / "repo")
    deltackpt.save(_state(24, 1 << 20), path)
    for p in (tmp_path / "repo" / "packs").rglob("*"):
        if p.is_file():
            p.read_bytes()
    growth = {}
    for mode in ("release", "keep"):
        out = subprocess.run([sys.executable, "-c", _PEAK_CHILD, path, mode], check=True, capture_output=True,
                             text=True, cwd=os.getcwd(), timeout=300).stdout
        growth[mode] = int(out.split()[-1]) / 1024   # MiB
    state_mib = 24 * 4
    assert growth["keep"] > state_mib + 60, growth           # the packs (~90 MiB) beside the state
    assert growth["release"] < state_mib + 40, growth        # RELEASE_BATCH and the spans in flight
