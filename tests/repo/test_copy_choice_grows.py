"""The copy choice (repo/read/copies.py) grows with the index instead of being walked again:
chunks indexed for the first time extend it, and what it chooses is what a walk over every copy
chooses (shortest real chain, ties by pack id and offset), or it says to walk again."""

from __future__ import annotations

import os
import random

import torch

import deltackpt
from deltackpt.format.pack import PackEntry
from deltackpt.repo.read.copies import Copy, extended, resolve, without
from deltackpt.repo.repository import Repository


def _cid(n: int) -> bytes:
    return n.to_bytes(16, "big")


def _copy(rng: random.Random, cid: int, base: int | None) -> Copy:
    pid = f"{rng.randrange(4):064x}"
    entry = PackEntry(_cid(cid), rng.randrange(1 << 20), 64, 1, 4096, None if base is None else _cid(base),
                      0 if base is None else 1)
    return pid, entry


def _graph(rng: random.Random, first: int, count: int, known: int) -> dict[bytes, list[Copy]]:
    """``count`` chunks from id ``first``, each with one to three copies: keyframes, or deltas of
    a chunk among the ``known`` ids before it or another new one (some of them never indexed)."""
    out: dict[bytes, list[Copy]] = {}
    for n in range(first, first + count):
        cps = []
        for _ in range(rng.randrange(1, 4)):
            kind = rng.random()
            if kind < 0.25:
                cps.append(_copy(rng, n, None))
            elif kind < 0.9 and known:
                cps.append(_copy(rng, n, rng.randrange(known)))
            else:   # a delta of another new chunk, or of one never indexed (a damaged repository)
                cps.append(_copy(rng, n, rng.randrange(first, first + count + 5)))
        out[_cid(n)] = cps
    return out


def test_extending_the_choice_chooses_what_a_full_walk_chooses():
    for seed in range(300):
        rng = random.Random(seed)
        old = _graph(rng, 0, rng.randrange(0, 40), 0)
        fresh = _graph(rng, 1000, rng.randrange(1, 30), len(old))
        before = resolve(old)
        if seed % 2:   # half of them with the reads-through map built, which extending then grows
            before._kids()
        got = extended(before, fresh)
        want = resolve({**old, **fresh})
        if got is None:   # only where a new chunk is the base some old copy waited for
            assert any(c[1].base in fresh for cps in old.values() for c in cps), seed
            continue
        assert got.depth == want.depth and got.best == want.best, seed
        assert got.dangling == want.dangling, seed
        # which chunks read through which (deltification's heights), grown with the choice
        assert {k: sorted(v) for k, v in got._kids().items()} == {k: sorted(v) for k, v in want._kids().items()}, seed


def test_leaving_packs_out_chooses_what_a_full_walk_chooses():
    """The choice without some packs, with copies of some of their objects kept in a new pack
    (supersede.py's plan), walks only the chunks whose chains went through those packs, and
    chooses as a walk over every usable copy does."""
    walked_again = 0
    for seed in range(300):
        rng = random.Random(seed)
        copies = _graph(rng, 0, rng.randrange(1, 60), 0)
        copies.update(_graph(rng, 1000, rng.randrange(0, 30), len(copies)))
        packs: dict[str, list[PackEntry]] = {}
        for cps in copies.values():
            for pid, e in cps:
                packs.setdefault(pid, []).append(e)
        unusable = set(rng.sample(sorted(packs), rng.randrange(0, len(packs) + 1)))
        extra = [(e.chunk_id, ("new", e)) for pid in sorted(unusable) for e in packs[pid] if rng.random() < 0.3]
        if seed % 7 == 0 and copies:   # now and then a copy that would shorten a chain
            cid = rng.choice(sorted(copies))
            extra.append((cid, _copy(rng, int.from_bytes(cid, "big"), None)))
        full = resolve(copies)
        got = without(full, copies, packs, unusable, extra)
        want = resolve(copies, lambda pid: pid not in unusable, extra)
        if got is None:
            walked_again += 1
            continue
        assert got.depth == want.depth and got.best == want.best, seed
    assert walked_again < 150


def test_a_save_extends_the_choice_and_a_rewrite_walks_again(tmp_path):
    """Each save's new pack extends the handle's copy choice, and merging index files keeps it
    (the same choice as a fresh handle computes); deltification, which indexes new copies of
    chunks indexed before, makes it walk again, and reads stay bit-identical."""
    path = str(tmp_path / "r")
    g = torch.Generator().manual_seed(1)
    table = torch.randn(32768, 64, generator=g)
    walks = []
    from deltackpt.repo.read import index_state
    real = index_state.resolve
    index_state.resolve = lambda *a, **k: (walks.append(1), real(*a, **k))[1]

    def move(step: int) -> None:
        if step:
            table[torch.randint(0, table.shape[0], (300,), generator=g)] += 0.01 * torch.randn(300, 64, generator=g)
    try:
        with deltackpt.Repo(path, create=True, deltify=False, keyframe_interval=2) as repo:
            for step in range(6):
                move(step)
                repo.save({"emb": table}, step=step)
            before = len(walks)
            for step in range(6, 20):
                move(step)
                repo.save({"emb": table}, step=step)
            # no walk: each save extended the choice, and merging the index files changed no copy
            assert len(walks) == before and len(repo.core.index.file_packs) < 19
            mine = repo.core.index.resolution
            fresh = Repository(path).index.resolution
            assert mine.best == fresh.best and mine.depth == fresh.depth
            assert repo.deltify(payback=0.05, lag=1).chunks > 0
            repo.core.index.refresh()
            assert repo.core.index.resolution.depth == Repository(path).index.resolution.depth
            assert len(walks) > before
    finally:
        index_state.resolve = real
    assert torch.equal(deltackpt.load(path)["emb"], table)
    assert os.path.isdir(path)
