"""A save's packs are written one after another, and each takes its stage buffers from the one
before (store/staged_write.StagePool, held by the save's Packer): a save writing many packs maps a
few stages, not two a pack (a GPT-2 + AdamW save wrote ~19 packs: 38 fresh 4 MiB stages, ~40,000
page faults of the kernel zeroing them)."""

from __future__ import annotations

import os

import torch

import deltackpt
from deltackpt.repo.write import packer as packer_module
from deltackpt.store import staged_write


def test_a_save_of_many_packs_maps_a_few_stages_and_reads_back_whole(tmp_path, monkeypatch):
    pools: list[staged_write.StagePool] = []

    class SeenPool(staged_write.StagePool):   # the pool itself, only remembered for the count
        def __init__(self) -> None:
            super().__init__()
            pools.append(self)

    monkeypatch.setattr(packer_module, "StagePool", SeenPool)
    monkeypatch.setattr(packer_module, "PACK_TARGET_BYTES", 6 << 20)   # ~7 packs of the 40 MB below
    gen = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.randn(1 << 20, generator=gen) for i in range(10)}   # random floats: planes stay raw
    path = str(tmp_path / "repo")
    deltackpt.save(state, path, step=0)
    packs = [f for _d, _s, fs in os.walk(os.path.join(path, "packs")) for f in fs]
    assert len(packs) >= 5, packs
    assert len(pools) == 1
    assert 1 <= pools[0].mapped <= 4, pools[0].mapped   # two a pack without the pool: 10 and more
    back = deltackpt.load(path)
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_a_store_whose_writer_takes_no_stages_still_saves(tmp_path, monkeypatch):
    """A store written before ``stages`` (its ``writer`` override takes only ``site`` and
    ``owner``) leaves ``stages_writes`` False and is never passed a pool: a save through it works."""
    from deltackpt.store import LocalStore

    class OlderStore(LocalStore):
        stages_writes = False

        def writer(self, *, site: str = "object", owner: "str | None" = None):  # type: ignore[override]
            return super().writer(site=site, owner=owner)

    monkeypatch.setattr(packer_module, "PACK_TARGET_BYTES", 6 << 20)
    state = {f"w{i}": torch.randn(1 << 20, generator=torch.Generator().manual_seed(i)) for i in range(4)}
    store = OlderStore(str(tmp_path / "repo"))
    with deltackpt.Repo(store, create=True) as repo:
        repo.save(state, step=0)
        back = repo.load()
    assert all(torch.equal(back[k], v) for k, v in state.items())
