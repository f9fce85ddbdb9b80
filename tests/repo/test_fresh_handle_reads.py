"""What a fresh handle reads of a long history.  Version-2 index files (format 3, spec §8) are
searched, not decoded whole: a reader looks up the chunks it reads and their chains' bases, and
chooses among those copies exactly what the choice over every copy would; a damaged file is
refused whole, naming it, before anything is looked up.  Ordering the history reads each
manifest's head, not its tensors."""

from __future__ import annotations

import random
import struct

import pytest
import torch
import xxhash
import zstandard

import deltackpt
from deltackpt.errors import CorruptObjectError
from deltackpt.format import index as index_fmt
from deltackpt.format.ids import hex_id
from deltackpt.format.index_table import ENTRY_BYTES, IndexTable
from deltackpt.format.pack import PackEntry
from deltackpt.repo.read.index_state import Index
from deltackpt.repo.repository import Repository
from deltackpt.store.local import LocalStore

PACK_LEN = 1 << 22


def _cid(n: int) -> bytes:
    return xxhash.xxh3_128_digest(n.to_bytes(8, "little"))   # spread like real ids


def _files(rng: random.Random, chunks: int) -> list[dict[str, tuple[int, list[PackEntry]]]]:
    """One to four index files over a few packs: each chunk has one to three copies, keyframes or
    deltas of another chunk (earlier or later, or one never indexed), so chains, cycles, ties
    between packs and dangling bases all occur."""
    packs = [f"{rng.getrandbits(128):032x}" for _ in range(rng.randrange(1, 6))]
    files: list[dict[str, tuple[int, list[PackEntry]]]] = [{} for _ in range(rng.randrange(1, 5))]
    offsets = iter(rng.sample(range(8, PACK_LEN - 100), chunks * 3))
    for n in range(chunks):
        for _ in range(rng.randrange(1, 4)):
            base = None if rng.random() < 0.3 else _cid(rng.randrange(chunks + 3))
            e = PackEntry(_cid(n), next(offsets), 64, 1, 4096, base, 0 if base is None else rng.randrange(1, 9))
            pid = rng.choice(packs)
            files[rng.randrange(len(files))].setdefault(pid, (PACK_LEN, []))[1].append(e)
    return files


def _write(store: LocalStore, packs: dict, version: int) -> None:
    data = index_fmt.encode(packs, version)
    store.put_atomic("index/" + hex_id(data), data)


def _answers(index: Index, cids: list[bytes]) -> list:
    return [(index.has_chunk(c), index.entries_for(c), index.chain_depth(c),
             index.entry(c) if index.has_chunk(c) else None) for c in cids]


def test_looking_chunks_up_chooses_what_the_choice_over_every_copy_chooses(tmp_path):
    for seed in range(120):
        rng = random.Random(seed)
        root = tmp_path / str(seed)
        store = LocalStore(root)
        chunks = rng.randrange(1, 50)
        for packs in _files(rng, chunks):
            _write(store, packs, 2)
        lazy, whole = Index(store, "r"), Index(store, "r")
        lazy.refresh()
        whole.refresh()
        whole.copies   # every entry in memory: the choice over all of them
        assert not lazy.holds_every_copy and whole.holds_every_copy
        asked = [_cid(n) for n in rng.sample(range(chunks + 3), rng.randrange(1, chunks + 4))]
        if seed % 2:
            lazy.prepare(asked[: len(asked) // 2])   # part looked up at once, the rest one by one
        assert _answers(lazy, asked) == _answers(whole, asked), seed
        assert not lazy.holds_every_copy, seed
        # another file arrives (a save by another process): what was looked up is looked up again
        for packs in _files(random.Random(seed + 1000), chunks)[:1]:
            _write(store, packs, 2)
        lazy.refresh()
        whole.refresh()
        assert not lazy.holds_every_copy and whole.holds_every_copy
        assert _answers(lazy, asked) == _answers(whole, asked), seed


def test_version_1_and_2_files_index_the_same_copies(tmp_path):
    """A repository's files of either version decode to the same packs and entries (per pack, by
    offset), so an index built from either holds the same copies."""
    for seed in range(40):
        rng = random.Random(seed)
        for packs in _files(rng, rng.randrange(1, 40)):
            v1 = index_fmt.decode(index_fmt.encode(packs, 1))
            v2 = index_fmt.decode(index_fmt.encode(packs, 2))
            assert {p: (n, sorted(es, key=lambda e: e.offset)) for p, (n, es) in v1.items()} == v2, seed


def _sealed(head: bytes, tables: bytes, frame: bytes | None = None) -> bytes:
    """A version-2 file from its head (P, N) and tables, compressed (or the given frame), with
    the checksum made right."""
    body = head + (zstandard.ZstdCompressor(level=1).compress(tables) if frame is None else frame)
    return index_fmt.MAGIC_V2 + body + struct.pack("<Q", xxhash.xxh64_intdigest(body))


def test_a_damaged_version_2_file_is_refused_whole_naming_it():
    """Every field a crafted file can get wrong is refused with CorruptObjectError naming the
    file; flipped bytes (in the tables, with the frame and checksum made right again) are refused
    or decode to entries that pass every check of §8, never another exception."""
    rng = random.Random(7)
    packs = _files(rng, 30)[0]
    good = index_fmt.encode(packs, 2)
    head = good[8:16]
    p, n = struct.unpack("<II", head)
    tables = zstandard.ZstdDecompressor().decompress(good[16:-8])
    assert len(tables) == 24 * p + ENTRY_BYTES * n and _sealed(head, tables) == good
    col = {name: 24 * p + off * n for name, off in (("chunk_id", 0), ("base", 16), ("offset", 32), ("length", 40),
                                                     ("raw_len", 44), ("pack", 48), ("depth", 52), ("encoding", 54))}
    depth0 = next(i for i in range(n) if tables[col["depth"] + 2 * i:col["depth"] + 2 * i + 2] == b"\0\0")

    def spoiled(at: int, fmt: str, value: int) -> bytes:
        bad = bytearray(tables)
        struct.pack_into(fmt, bad, at, value)
        return _sealed(head, bytes(bad))

    frame = good[16:-8]
    ids = col["chunk_id"]
    cases = {
        "checksum": good[:-1] + bytes([good[-1] ^ 1]),
        "frame too short": _sealed(head, tables[:-1]),
        "frame too long": _sealed(head, tables + b"\0"),
        "counts": _sealed(struct.pack("<II", p, n + 1), tables),
        "counts over the limit": _sealed(struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF), tables),
        "not a frame": _sealed(head, tables, frame=b"\0" * 40),
        "bytes after the frame": _sealed(head, tables, frame=frame + b"\0"),
        "two frames": _sealed(head, tables, frame=frame + frame),
        "pack row": spoiled(col["pack"], "<I", p),
        "order": _sealed(head, tables[:ids] + tables[ids + 16:ids + 32] + tables[ids:ids + 16] + tables[ids + 32:]),
        "short object": spoiled(col["length"], "<I", 11),
        "raw length": spoiled(col["raw_len"], "<I", (64 << 20) + 1),
        "depth": spoiled(col["depth"], "<H", 1025),
        "offset": spoiled(col["offset"], "<Q", 7),
        "outside": spoiled(col["offset"], "<Q", PACK_LEN - 20 - 63),
        "huge offset": spoiled(col["offset"], "<Q", 1 << 63),
        "base at depth 0": spoiled(col["base"] + 16 * depth0, "<B", 1),
        "pack length": spoiled(16, "<Q", (1 << 40) + 1),
    }
    # a bomb: 10 MiB of zeros in a 339-byte frame whose header claims the tables' size
    bomb = bytearray(zstandard.ZstdCompressor(level=1).compress(b"\0" * (10 << 20)))
    assert bomb[4] >> 6 == 2 and not bomb[4] & 0x23   # a 4-byte content size at byte 6
    struct.pack_into("<I", bomb, 6, len(tables))
    cases["a frame decoding to more than it declares"] = _sealed(head, tables, frame=bytes(bomb))
    for why, data in cases.items():
        with pytest.raises(CorruptObjectError, match="index/x"):
            IndexTable.decode(data, what="index/x")
        assert why
    refused = 0
    for _ in range(3000):
        bad = bytearray(tables)
        for _ in range(rng.randrange(1, 4)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        try:
            table = IndexTable.decode(_sealed(head, bytes(bad)), what="index/x")
        except CorruptObjectError:
            refused += 1
            continue
        for pid, (plen, entries) in table.packs().items():
            for e in entries:   # what decoded passes the entry checks of a version-1 reader
                assert PackEntry.from_list(list(e), what="x", pack_len=plen) == e
    assert 0 < refused < 3000


def test_a_restart_reads_the_newest_version_without_building_the_index(tmp_path):
    """A format-3 repository's newest version loads in a fresh handle through lookups alone:
    entries are built for the chunks read (and their bases), not for every stored copy; a save
    that stores something then has every copy in memory, as before."""
    path = str(tmp_path / "r")
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
    for step in range(5):
        with torch.no_grad():
            model[step % 6].weight.add_(1.0)
        deltackpt.save(model.state_dict(), path, step=step)
    core = Repository(path)
    assert core.config.version == 3
    assert all(core.store.get(k)[:8] == b"DCKIDX\x02\x00" for k in core.store.list("index/"))
    state = deltackpt.load(path)
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v)
    m = core.manifest(core.resolve("latest"))
    loaded = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
    core.chunks.prepare(m.blobs)
    assert not core.index.holds_every_copy
    looked = len(core.index._looked)
    stored = sum(len(es) for t in core.index._tables for _p, (_n, es) in t.packs().items())
    assert 0 < looked < stored
    with deltackpt.Repo(path) as repo:
        repo.restore(loaded)
        assert not repo.core.index.holds_every_copy
        for k, v in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[k], v)
        repo.save(model.state_dict(), step=5)   # nothing new to store: dedup needs lookups alone
        assert not repo.core.index.holds_every_copy
        with torch.no_grad():
            model[0].weight.add_(1.0)
        repo.save(model.state_dict(), step=6)
        assert repo.core.index.holds_every_copy
    assert deltackpt.Repo(path).verify().ok
    assert torch.equal(deltackpt.load(path)["0.weight"], model[0].weight)


def test_readers_never_see_a_half_built_index(tmp_path):
    """Threads reading through lookups while another thread builds every copy in memory get the
    same answers throughout: the columns stay theirs until the last entry is in."""
    import sys
    import threading
    rng = random.Random(3)
    store = LocalStore(tmp_path)
    chunks = 300
    for packs in _files(rng, chunks):
        _write(store, packs, 2)
    whole = Index(store, "r")
    whole.refresh()
    whole.copies
    asked = [_cid(n) for n in range(chunks)]
    want = [_answers(whole, [c]) for c in asked]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # threads switch often, so a window between two steps shows
    try:
        for round_ in range(5):
            lazy = Index(store, "r")
            lazy.refresh()
            wrong: list = []
            started = threading.Barrier(4)

            def read(k: int) -> None:
                started.wait()
                for n in range(k, k + 2 * chunks):
                    try:
                        if _answers(lazy, [asked[n % chunks]]) != want[n % chunks]:
                            wrong.append(n)
                    except Exception as exc:   # noqa: BLE001 - reported below
                        wrong.append(exc)

            readers = [threading.Thread(target=read, args=(37 * k,)) for k in range(3)]
            for t in readers:
                t.start()
            started.wait()
            lazy.copies
            for t in readers:
                t.join()
            assert not wrong, (round_, wrong[:3])
            assert lazy.holds_every_copy
    finally:
        sys.setswitchinterval(interval)


def test_a_fresh_handle_orders_the_history_without_decoding_whole_manifests(tmp_path, monkeypatch):
    """Ordering a history (what retention, gc and the step after a save read first) reads each
    version's head alone; a whole manifest is decoded only for a version read."""
    from deltackpt.format import manifest as manifest_fmt
    path = str(tmp_path / "r")
    for step in range(6):
        deltackpt.save({"w": torch.full((8,), float(step))}, path, step=step, metrics={"loss": 1.0 / (step + 1)})
    whole = []
    real = manifest_fmt.decode
    monkeypatch.setattr(manifest_fmt, "decode", lambda *a, **k: whole.append(1) or real(*a, **k))
    core = Repository(path)
    order = core.history_order()
    assert len(order) == 6 and not whole
    assert [core.head(v).step for v in order] == [5, 4, 3, 2, 1, 0]
    assert core.head(order[0]).metrics == {"loss": 1.0 / 6}
    assert torch.equal(deltackpt.load(path, order[-1])["w"], torch.zeros(8)) and whole
