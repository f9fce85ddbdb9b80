"""Regressions for defects found while writing the spec (spec/FORMAT.md, appendix)."""

from __future__ import annotations

import os

import pytest
import torch

import deltackpt
from deltackpt.format import index as index_fmt
from deltackpt.format.ids import hex_id
from deltackpt.format.manifest import Blob, ChunkRef, Manifest, TensorEntry, TensorRef
from deltackpt.repo.repository import Repository


def _loads_before_and_after_gc(repo_path: str, expected: torch.Tensor) -> None:
    """A fresh handle loads ``expected``; after gc (keep the latest) too; and the repository verifies."""
    assert torch.equal(deltackpt.load(repo_path)["w"], expected)
    deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert torch.equal(deltackpt.load(repo_path)["w"], expected)
    assert deltackpt.Repo(repo_path).verify().ok


def test_an_index_file_naming_a_missing_pack_neither_hides_the_chunk_nor_makes_gc_drop_it(repo_path):
    """A stale index entry (a pack that is gone) sorting first: load uses the good copy, gc keeps it."""
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 64)}
    deltackpt.save(state, repo_path, step=0)
    items = Repository(repo_path).index.items()
    plen = max(e.offset + e.length for _, _, e in items) + 20
    with open(os.path.join(repo_path, "index", "0" * 32), "wb") as f:  # sorts before the real index file
        f.write(index_fmt.encode({"0" * 32: (plen, [e for _, _, e in items])}))
    _loads_before_and_after_gc(repo_path, state["w"])


def test_gc_stops_before_deleting_when_a_live_chunk_is_in_no_pack(repo_path):
    """If a kept version's chunk exists nowhere, gc raises CorruptObjectError and removes nothing."""
    deltackpt.save({"w": torch.randn(64, 64)}, repo_path)
    deltackpt.save({"w": torch.randn(64, 64)}, repo_path)
    repo = deltackpt.Repo(repo_path)
    pid, _ = repo.core.index.entry(repo.core.manifest(repo.core.resolve("latest")).blobs[0].chunks[0].chunk_id)
    os.unlink(os.path.join(repo_path, "packs", pid[:2], pid))
    before = sorted(os.listdir(os.path.join(repo_path, "manifests")))
    with pytest.raises(deltackpt.CorruptObjectError, match="stopped before deleting"):
        deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert sorted(os.listdir(os.path.join(repo_path, "manifests"))) == before


@pytest.mark.parametrize("name", ["abcd", "deadbeef", "0123456789abcdef0123456789abcdef"])
def test_tags_that_look_like_version_ids_are_refused(repo_path, name):
    """A tag of 4+ lowercase hex digits would shadow id prefixes, so it is an InvalidNameError."""
    deltackpt.save({"w": torch.zeros(2)}, repo_path)
    with pytest.raises(deltackpt.InvalidNameError, match="shadow"):
        deltackpt.Repo(repo_path).tag(name)


def test_a_manifest_declaring_an_impossible_blob_is_a_typed_error(repo_path):
    """A small manifest declaring a 64 TiB tensor makes load raise a typed error, never a bare MemoryError."""
    deltackpt.save({"w": torch.zeros(4)}, repo_path)
    m = Manifest(parent=None, time=1.0, tree={"w": TensorRef(0)},
                 tensors=[TensorEntry("w", ["w"], "float32", [1 << 44], [1], 0, 0)],
                 blobs=[Blob(1 << 46, 4, 4, [ChunkRef(bytes(16), 1 << 26)] * (1 << 20))])
    data = m.to_bytes()
    vid = hex_id(data)
    with open(os.path.join(repo_path, "manifests", vid), "wb") as f:
        f.write(data)
    with pytest.raises(deltackpt.DeltackptError) as info:  # refused before allocating (chunks not backed)
        deltackpt.load(repo_path, vid)
    assert vid[:10] in str(info.value)


def test_after_gc_dies_deleting_old_index_files_readers_use_the_rebased_copy(repo_path):
    """gc rebased a delta into a keyframe (new pack, new index) and died before deleting the old
    index file and pack that still name the delta, whose base is gone.  Of the two copies, readers
    and the next gc use the shallower one, so the kept version restores; before, the first copy
    met (the delta) made it unreadable and gc refused to run.  (Forward chains: the third save's
    index then names only its delta, whose base is the second save's delta: gc rebases such a
    chunk, where it keeps a keyframe base.)"""
    import shutil
    from deltackpt.format.index import decode
    deltackpt.Repo.init(repo_path, delta_base="parent")
    torch.manual_seed(0)
    w = torch.randn(256, 64)
    deltackpt.save({"w": w}, repo_path, step=0)
    deltackpt.save({"w": w + 1e-3 * torch.randn(256, 64)}, repo_path, step=1)
    index_dir, packs_dir = os.path.join(repo_path, "index"), os.path.join(repo_path, "packs")
    before = set(os.listdir(index_dir))
    state = {"w": w + 2e-3 * torch.randn(256, 64)}
    deltackpt.save(state, repo_path, step=2)
    (second_index,) = set(os.listdir(index_dir)) - before
    saved = os.path.join(repo_path, "..", "second-save")
    os.makedirs(saved)
    shutil.copy(os.path.join(index_dir, second_index), saved)
    packs = decode(open(os.path.join(index_dir, second_index), "rb").read())
    assert any(e.depth > 0 for _, entries in packs.values() for e in entries)  # the premise: a delta
    for pid in packs:
        shutil.copy(os.path.join(packs_dir, pid[:2], pid), saved)
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert report.chunks_rebased > 0
    # the crash: the old index file (sorting first) and its pack are still there
    shutil.copy(os.path.join(saved, second_index), os.path.join(index_dir, "0" * 32))
    for pid in packs:
        os.makedirs(os.path.join(packs_dir, pid[:2]), exist_ok=True)
        shutil.copy(os.path.join(saved, pid), os.path.join(packs_dir, pid[:2], pid))
    _loads_before_and_after_gc(repo_path, state["w"])


# issue 17, item 5: defects a second implementation found -------------------------------------
def _shown(repo_path: str) -> dict:
    (t,) = deltackpt.Repo(repo_path).show()["tensors"]
    return t


@pytest.mark.parametrize("case", ["first-save", "unchanged-after-fallback", "cast-is-exact", "non-finite"])
def test_a_lossy_mode_that_stored_every_chunk_as_given_leaves_the_tensor_exact(repo_path, case):
    """A lossy pattern whose chunks were all stored losslessly (no base yet, the same bytes again,
    fp16 of values fp16 holds exactly, non-finite values) gives exact=True, max_abs_err 0.0 and
    encoding "lossless"; before, exact was false whenever the pattern matched."""
    torch.manual_seed(0)
    w = torch.arange(64, dtype=torch.float32) if case == "cast-is-exact" else torch.randn(256)
    mode = "fp16" if case == "cast-is-exact" else "q8-delta"
    deltackpt.save({"w": w}, repo_path, encoding={"w": mode})
    if case == "unchanged-after-fallback":
        deltackpt.save({"w": w}, repo_path, encoding={"w": mode})
    elif case == "non-finite":
        w = w + 1e-3
        w[3] = float("nan")
        deltackpt.save({"w": w}, repo_path, encoding={"w": mode})
    t = _shown(repo_path)
    assert (t["exact"], t["max_abs_err"], t["encoding"]) == (True, 0.0, "lossless")
    loaded, version = deltackpt.load(repo_path, return_version=True)
    assert version.exact and torch.equal(loaded["w"].view(torch.int32), w.view(torch.int32))


def test_a_really_lossy_tensor_is_inexact_with_its_error_also_when_saved_again_unchanged(repo_path):
    """A chunk stored lossily gives exact=False and the true max_abs_err, and so does the next save
    of the same bytes, which reuses that approximation (before, it recorded max_abs_err 0.0)."""
    torch.manual_seed(0)
    w = torch.randn(256)
    enc = {"w": "q8-delta"}
    deltackpt.save({"w": w}, repo_path, encoding=enc)
    truth = w + 0.01 * torch.randn(256)
    for _ in range(2):
        deltackpt.save({"w": truth}, repo_path, encoding=enc)
        t = _shown(repo_path)
        err = (deltackpt.load(repo_path)["w"].double() - truth.double()).abs().max().item()
        assert (t["exact"], t["encoding"]) == (False, "q8-delta")
        assert t["max_abs_err"] == pytest.approx(err) and err > 0


def test_an_index_file_of_an_unknown_version_is_a_format_version_error_naming_it(repo_path):
    """An index file whose version byte this reader does not know raises FormatVersionError naming
    the file (the spec's rule), instead of being skipped as a damaged index file."""
    deltackpt.save({"w": torch.zeros(4)}, repo_path)
    (key,) = os.listdir(os.path.join(repo_path, "index"))
    path = os.path.join(repo_path, "index", key)
    data = bytearray(open(path, "rb").read())
    data[6] = 3
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(deltackpt.FormatVersionError, match=f"index/{key}: index version 3"):
        deltackpt.load(repo_path)
    data[6], data[0] = 1, ord("X")  # a damaged file is still skipped and reported, as before
    with open(path, "wb") as f:
        f.write(data)
    repo = Repository(repo_path)
    assert list(repo.index.bad_files) == [f"index/{key}"]


def test_a_tag_file_that_looks_like_an_id_prefix_never_shadows_the_version(repo_path):
    """A file refs/tags/<4-32 hex> (planted, or left by an old writer) is never followed: the
    revision means the version id prefix, so a repository cannot redirect an id."""
    first = deltackpt.save({"w": torch.zeros(4)}, repo_path)
    second = deltackpt.save({"w": torch.ones(4)}, repo_path)
    prefix = second.id[:8]
    os.makedirs(os.path.join(repo_path, "refs", "tags"), exist_ok=True)
    with open(os.path.join(repo_path, "refs", "tags", prefix), "w") as f:
        f.write(first.id + "\n")
    assert Repository(repo_path).resolve(prefix) == second.id
    assert prefix not in deltackpt.Repo(repo_path).tags()


def test_a_revision_is_bounded_after_stripping_whitespace(repo_path):
    """The 256-character bound applies to the stripped revision, as the spec says: padding is
    allowed, 257 characters are not."""
    v = deltackpt.save({"w": torch.zeros(4)}, repo_path)
    repo = Repository(repo_path)
    assert repo.resolve(" " * 300 + "latest\n") == v.id
    with pytest.raises(deltackpt.UnknownVersionError, match="1-256 characters"):
        repo.resolve("a" * 257)


def test_best_selects_a_metric_whose_name_contains_colons(repo_path):
    """best:METRIC[:min|:max] takes only a final :min/:max as the direction, so metrics named
    "val:acc" or "x:max" can be selected; before, any metric name with ':' was unselectable."""
    metrics = [{"val:acc": 0.5, "x:max": 3.0}, {"val:acc": 0.9, "x:max": 1.0}, {"val:acc": 0.7, "x:max": 2.0}]
    ids = [deltackpt.save({"w": torch.zeros(4)}, repo_path, metrics=m).id for m in metrics]
    repo = Repository(repo_path)
    assert repo.resolve("best:val:acc:max") == ids[1]
    assert repo.resolve("best:val:acc") == repo.resolve("best:val:acc:min") == ids[0]
    assert repo.resolve("best:x:max:min") == ids[1]
    assert repo.resolve("best:x:max:max") == ids[0]
    with pytest.raises(deltackpt.UnknownVersionError):
        repo.resolve("best::max")


def _twin_pack(repo_path: str) -> tuple[str, str, bytes]:
    """Store the only chunk of a one-tensor version a second time, in a second pack (as two racing
    saves would), with its own index file, such that the index files sort in the opposite order
    of the pack ids; returns (first pack id, second pack id, chunk id)."""
    from deltackpt.format.pack import PackBuilder
    from deltackpt.repo.layout import INDEX, pack_key
    repo = Repository(repo_path)
    (pid, entries), = repo.index.pack_entries.items()
    (first_index,) = repo.index.file_packs
    e = entries[0]
    obj = repo.store.get(pack_key(pid), e.offset, e.length)
    for filler in range(256):
        b = PackBuilder()
        b.add(bytes([filler]) * 16, b"\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00" + bytes([filler]),
              encoding=0, raw_len=1, base=None, depth=0)
        b.add(e.chunk_id, obj, encoding=e.encoding, raw_len=e.raw_len, base=e.base, depth=e.depth)
        data = b.finish()
        twin = hex_id(data)
        body = index_fmt.encode({twin: (len(data), list(b.entries))})
        if (INDEX + hex_id(body) < first_index) == (twin > pid):  # index order and id order disagree
            break
    repo.store.put_atomic(pack_key(twin), data)
    repo.store.put_atomic(INDEX + hex_id(body), body)
    return pid, twin, e.chunk_id


def test_copies_of_equal_depth_are_chosen_by_pack_id_then_offset(repo_path):
    """Two keyframe copies of one chunk: the one in the pack with the smaller id is read, whatever
    order the index files (or their maps) list them in (spec §8)."""
    deltackpt.save({"w": torch.randn(64, 64)}, repo_path)
    first, twin, cid = _twin_pack(repo_path)
    repo = Repository(repo_path)
    assert repo.index.entry(cid)[0] == min(first, twin)
    assert [p for p, _ in repo.index.entries_for(cid)] == sorted([first, twin])


def test_a_damaged_chosen_copy_falls_back_to_an_intact_twin(repo_path):
    """The copy a reader chooses fails its hash while another copy is intact: load returns the
    right bytes through the twin, and verify still reports the damaged copy (spec §8)."""
    from deltackpt.repo.layout import pack_key
    w = torch.randn(64, 64)
    deltackpt.save({"w": w}, repo_path)
    first, twin, cid = _twin_pack(repo_path)
    chosen = min(first, twin)
    repo = Repository(repo_path)
    e = next(e for e in repo.index.pack_entries[chosen] if e.chunk_id == cid)
    path = os.path.join(repo_path, pack_key(chosen))
    with open(path, "r+b") as f:
        f.seek(e.offset + e.length - 1)
        last = f.read(1)
        f.seek(e.offset + e.length - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    assert torch.equal(deltackpt.load(repo_path)["w"], w)
    report = deltackpt.Repo(repo_path).verify()
    assert not report.ok and chosen in str(report.to_json())


@pytest.mark.parametrize("k", [1, 2])
def test_no_chunk_is_ever_deeper_than_the_keyframe_interval(repo_path, k):
    """Values that come back (old states restored and saved again), sparse and dense changes,
    deltification and gc: every chunk any version names keeps a real depth <= K (spec §10; the
    second reader found depth K + 1 at K = 1 with old states coming back)."""
    deltackpt.Repo.init(repo_path, keyframe_interval=k)
    g = torch.Generator().manual_seed(k)
    states = [torch.randn(4096, 64, generator=g)]
    for i in range(12):
        if i % 4 == 3:
            nxt = states[i // 2].clone()                     # an old state comes back
        elif i % 2:
            nxt = states[-1].clone()
            nxt[torch.randint(0, 4096, (40,), generator=g)] += 1.0   # sparse rows
        else:
            nxt = states[-1] + 1e-3 * torch.randn(4096, 64, generator=g)  # dense
        states.append(nxt)
        deltackpt.save({"w": nxt}, repo_path, step=i)
        if i % 3 == 2:
            deltackpt.Repo(repo_path).deltify(lag=1)
    deltackpt.gc(repo_path, keep_every=3, keep_last=2, grace_seconds=0)
    deltackpt.Repo(repo_path).deltify(lag=1)
    repo = Repository(repo_path)
    for vid in repo.version_ids():
        for b in repo.manifest(vid).blobs:
            for c in b.chunks:
                assert repo.index.chain_depth(c.chunk_id) <= k, (vid[:8], repo.index.chain_depth(c.chunk_id))
    assert deltackpt.Repo(repo_path).verify().ok
