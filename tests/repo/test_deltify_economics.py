"""What deltification is worth: it re-stores a whole period of sparse forward deltas in reverse
(not only its keyframe), it writes nothing that would not free a pack at least half redundant, and
saves keep keyframes that will stay whole apart so their packs never need copying (deltify.py,
supersede.py, head.stays_whole)."""

from __future__ import annotations

import os

import torch

import deltackpt
from deltackpt.repo.repository import Repository

#: these tests check deltification's mechanics on runs whose deltas save a quarter or so of a
#: keyframe (dense fine-tunes): they ask it to rewrite whatever saves at least 5% (the default,
#: head.PAYBACK, leaves those whole; tests/repo/test_maintenance_payback.py pins the default)
MECHANICS = 0.05


def _pack_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(path, "packs")) for f in fs)


def _sparse_run(path: str, saves: int, *, skew: float = 1.0, **init) -> list[torch.Tensor]:
    """An embedding table (4 chunks) of which each save moves 300 random rows (``skew`` > 1: most
    of them near the top, so its chunks' periods end at different saves)."""
    g = torch.Generator().manual_seed(1)
    deltackpt.Repo.init(path, **init)
    table = torch.randn(32768, 64, generator=g)
    out = []
    for step in range(saves):
        if step:
            idx = (torch.rand(300, generator=g) ** skew * table.shape[0]).long()
            table[idx] += 0.01 * torch.randn(300, 64, generator=g)
        deltackpt.save({"emb": table}, path, step=step)
        out.append(table.clone())
    return out


def _forward_copies_outside_latest(path: str) -> int:
    """Copies of chunks that latest does not read whose base is the chunk at the same position in
    the version before (a forward delta)."""
    repo = Repository(path)
    history = repo.history_order()
    by_version = [[c.chunk_id for b in repo.manifest(v).blobs for c in b.chunks] for v in history]
    latest_needs = repo.index.chunk_closure(by_version[0])
    count = 0
    for newer, older in zip(by_version, by_version[1:]):
        for cid, prev in zip(newer, older):
            if cid in latest_needs or cid == prev:
                continue
            count += sum(1 for _pid, e in repo.index.entries_for(cid) if e.base == prev)
    return count


def test_a_period_of_sparse_forward_deltas_is_reversed_whole(tmp_path, monkeypatch):
    """Once newer keyframes end a period of forward deltas, deltify re-stores each of its chunks
    against the next newer one (format 2's reverse chain) and drops the forward deltas: the
    repository ends no larger than the forward chains themselves, where re-storing the period's
    keyframe alone keeps every forward delta and adds a delta holding all the period's rows."""
    child, parent = str(tmp_path / "child"), str(tmp_path / "parent")
    tables = _sparse_run(child, 24)
    _sparse_run(parent, 24, delta_base="parent")
    assert _forward_copies_outside_latest(child) > 0
    report = deltackpt.Repo(child).deltify(payback=MECHANICS, lag=1)
    assert report.chunks > 0 and report.freed_bytes > report.written_bytes
    assert _forward_copies_outside_latest(child) == 0
    assert _pack_bytes(child) <= 1.02 * _pack_bytes(parent)
    repo = Repository(child)
    for k, table in enumerate(reversed(tables)):
        m = repo.manifest(repo.resolve(f"latest~{k}"))
        assert max(repo.index.chain_depth(c.chunk_id) for b in m.blobs for c in b.chunks) <= repo.config.keyframe_interval
        assert torch.equal(deltackpt.load(child, f"latest~{k}")["emb"], table), k
    assert deltackpt.Repo(child).verify().ok


def _mixed_run(path: str, saves: int, *, smooth: int, noise: int) -> list[dict]:
    """Two tensors: ``smooth`` floats that drift a little each save (their deltas are small) and
    ``noise`` floats drawn anew each save (no delta helps them)."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(smooth, generator=g)
    out = []
    with deltackpt.Repo(path, create=True, payback=MECHANICS) as repo:
        for step in range(saves):
            w = w + 1e-3 * torch.randn(smooth, generator=g)
            state = {"w": w.clone(), "noise": torch.randn(noise, generator=g)}
            repo.save(state, step=step)
            out.append(state)
    return out


def test_deltify_writes_nothing_that_would_not_free_half_a_pack(tmp_path, monkeypatch):
    """The first version's pack holds a drifting tensor (worth deltas) beside a larger one of fresh
    noise (kept whole).  Re-storing the drifting one would free under half of that pack, and a
    rewrite would copy the rest: deltify writes nothing.  Where the drifting tensor is most of the
    pack, it is re-stored and every byte written frees more than itself."""
    small, big = str(tmp_path / "small"), str(tmp_path / "big")
    _mixed_run(small, 2, smooth=1 << 20, noise=3 << 20)
    states = _mixed_run(big, 2, smooth=3 << 20, noise=1 << 19)
    before = _pack_bytes(small)
    report = deltackpt.Repo(small).deltify(payback=MECHANICS, lag=1)
    assert report.written_bytes == 0 and report.chunks == 0
    assert _pack_bytes(small) == before
    report = deltackpt.Repo(big).deltify(payback=MECHANICS, lag=1)
    assert report.chunks > 0 and report.freed_bytes > 1.2 * report.written_bytes
    for k, state in enumerate(reversed(states)):
        got = deltackpt.load(big, f"latest~{k}")
        assert torch.equal(got["w"], state["w"]) and torch.equal(got["noise"], state["noise"])


def test_keyframes_that_will_stay_whole_are_packed_apart(tmp_path, monkeypatch):
    """Once a position has changed densely beyond any delta, a save writes its next keyframes to a
    pack of their own; deltification then drops the other pack of each later save outright and
    leaves those alone: nothing of them is copied."""
    path = str(tmp_path / "r")
    states = _mixed_run(path, 5, smooth=1 << 20, noise=1 << 20)
    repo = Repository(path)
    first = repo.history_order()[-1]
    noise = {c.chunk_id for v in repo.history_order()[:-1] for t, b in _blobs(repo, v) if t == "noise"
             for c in b.chunks}
    apart = {pid for pid, entries in repo.index.pack_entries.items() if {e.chunk_id for e in entries} <= noise}
    assert len(apart) == 4  # each save after the first: its noise keyframes in a pack of their own
    report = deltackpt.Repo(path).deltify(payback=MECHANICS, lag=1)
    assert report.chunks == 8 and report.encodings.get("sub-delta") == 8  # the drifting tensor, 4 versions
    repo = Repository(path)
    assert apart <= set(repo.index.pack_entries)  # kept as they were: never rewritten
    first_ids = {c.chunk_id for t, b in _blobs(repo, first) if t == "noise" for c in b.chunks}
    first_noise = sum(e.length for entries in repo.index.pack_entries.values() for e in entries if e.chunk_id in first_ids)
    deltas = sum(e.length for entries in repo.index.pack_entries.values() for e in entries if e.base is not None)
    assert report.written_bytes < deltas + first_noise + 4096  # the deltas, the first save's noise, the index
    for k, state in enumerate(reversed(states)):
        got = deltackpt.load(path, f"latest~{k}")
        assert torch.equal(got["w"], state["w"]) and torch.equal(got["noise"], state["noise"])


def _blobs(repo: Repository, vid: str):
    m = repo.manifest(vid)
    return [(".".join(map(str, t.key)), m.blobs[t.blob]) for t in m.tensors]


def test_what_deltify_remembers_never_changes_what_it_ends_up_doing(tmp_path, monkeypatch):
    """The first save's pack holds a drifting tensor, a tensor that first changes at the third save,
    and noise.  Leaving the two newest versions alone, deltify can re-store only the drifting one
    out of that pack, too little of it: it waits.  Once only the newest is left alone (as after
    the next save), the late tensor's first chunks are candidates too, and the pack is mostly
    redundant: the run on the same handle must take it up, as a handle that remembers nothing
    does, and not skip it as found not worth it before."""
    sizes = []
    for forget in (False, True):
        path = str(tmp_path / f"forget{forget}")
        g = torch.Generator().manual_seed(4)
        deltackpt.Repo.init(path)
        w, late = torch.randn(1 << 20, generator=g), torch.randn(3 << 19, generator=g)
        for step in range(3):
            w = w + 1e-3 * torch.randn(w.shape, generator=g)
            if step == 2:
                late = late + 1e-3 * torch.randn(late.shape, generator=g)
            deltackpt.save({"w": w, "late": late, "noise": torch.randn(1 << 20, generator=g)}, path, step=step)
        repo = deltackpt.Repo(path)
        assert repo.deltify(payback=MECHANICS, lag=2).chunks == 0
        if forget:
            repo.session.deltify_memo = None
        assert repo.deltify(payback=MECHANICS, lag=1).chunks > 0
        sizes.append(_pack_bytes(path))
        got = deltackpt.load(path)
        assert torch.equal(got["w"], w) and torch.equal(got["late"], late)
    assert sizes[0] == sizes[1], sizes




def test_a_delta_measured_before_is_not_encoded_again_until_it_is_kept(tmp_path, monkeypatch):
    """Deltify judges a pack by what its candidates would free, measures their deltas, and drops
    them all when the pack would still not end redundant enough (on a dense fine-tune: a period
    whose keyframe alone is re-stored leaves its forward deltas in the next pack).  Here every
    pack is asked to end wholly redundant, so every conversion is dropped.  A second run that
    judges the same periods again, with everything else it remembers forgotten (the packs'
    state, the positions' verdicts), encodes nothing: it knows the deltas' sizes.  A handle that
    remembers nothing encodes them all again.  Once packs can be freed, each delta kept is encoded
    once more, to be written, and the repository ends as the forgetting handle leaves it."""
    from deltackpt.repo.write import deltify
    from deltackpt.repo.write.deltify_memo import DeltifyMemo

    encoded: list[bytes] = []
    real = deltify._reverse_delta
    monkeypatch.setattr(deltify, "_reverse_delta",
                        lambda old, base_id, *a: (encoded.append(base_id), real(old, base_id, *a))[1])

    def run(path: str, forget: bool) -> tuple[list[int], list[int], int]:
        g = torch.Generator().manual_seed(1)
        table = torch.randn(32768, 64, generator=g)
        calls, chunks = [], []
        # a keyframe every third save: periods end at every position
        with deltackpt.Repo(path, create=True, deltify=False, payback=MECHANICS, keyframe_interval=2) as repo:
            for step in range(9):
                if step:
                    table[torch.randint(0, table.shape[0], (300,), generator=g)] += 0.01 * torch.randn(300, 64, generator=g)
                repo.save({"emb": table}, step=step)
            for fraction in (1.01, 1.01, deltify.REWRITE_DEAD_FRACTION):
                monkeypatch.setattr(deltify, "REWRITE_DEAD_FRACTION", fraction)
                memo = repo.session.deltify_memo
                repo.session.deltify_memo = None
                if memo is not None and not forget:
                    repo.session.deltify_memo = DeltifyMemo(encoded=memo.encoded)
                encoded.clear()
                chunks.append(repo.deltify(lag=1).chunks)
                calls.append(len(encoded))
        assert torch.equal(deltackpt.load(path)["emb"], table)
        return calls, chunks, _pack_bytes(path)

    kept, kept_chunks, kept_bytes = run(str(tmp_path / "kept"), forget=False)
    none, none_chunks, none_bytes = run(str(tmp_path / "none"), forget=True)
    assert kept_chunks == none_chunks and kept_chunks[:2] == [0, 0] and kept_chunks[2] > 0
    # the same deltas either way; sizes within 1% (the encoding threads' reused zstd contexts have
    # been seen to differ by a few bytes on the same input)
    assert abs(kept_bytes - none_bytes) <= none_bytes // 100
    assert kept[0] == none[0] == none[1] > 0 and kept[1] == 0
    assert kept[2] == kept_chunks[2] <= none[2]   # the deltas written, each encoded once here
