"""What a small save skips.  A state under INLINE_STATE_BYTES is encoded by the thread that
writes it (a pool's start and its interpreter-lock hand-offs cost more than they save on a few
MB), a larger one by a pool of encoder threads, joined before the save returns; both store the
same bytes.  And a small model whose large chunks stay whole writes one pack a save."""

from __future__ import annotations

import threading

import pytest
import torch

import deltackpt
from deltackpt.repo.write import encoder_pool


def _save_counting_encoders(monkeypatch, path, state) -> int:
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self):
        started.append(self.name)
        real_start(self)

    with monkeypatch.context() as m:
        m.setattr(threading.Thread, "start", counting_start)
        deltackpt.save(state, path, step=0)
    assert not [t for t in threading.enumerate() if t.name.startswith("deltackpt-encode")]
    return sum(name.startswith("deltackpt-encode") for name in started)


def test_a_small_state_starts_no_encoder_thread_and_a_large_one_a_pool(tmp_path, monkeypatch):
    small_elems = (encoder_pool.INLINE_STATE_BYTES - 4096) // 4
    large_elems = (encoder_pool.INLINE_STATE_BYTES + (1 << 20)) // 4
    g = torch.Generator().manual_seed(0)
    small = {"w": torch.randn(small_elems, generator=g), "b": torch.randn(3, generator=g)}
    large = {"w": torch.randn(large_elems, generator=g), "b": torch.randn(3, generator=g)}
    assert _save_counting_encoders(monkeypatch, tmp_path / "small", small) == 0
    assert _save_counting_encoders(monkeypatch, tmp_path / "large", large) >= 1
    for name, state in (("small", small), ("large", large)):
        back = deltackpt.load(tmp_path / name)
        assert all(torch.equal(back[k].view(torch.int32), state[k].view(torch.int32)) for k in state)


def test_a_small_model_whose_large_chunks_stay_whole_writes_one_pack_a_save(tmp_path):
    """Chunks under MIN_POSITION_BYTES are packed with the keyframes that stay whole (neither is
    ever rewritten by deltification): once the large chunks are known to change densely, a save
    writes one pack, not a second one of a few KiB."""
    from deltackpt.repo.write.deltify_plan import MIN_POSITION_BYTES

    g = torch.Generator().manual_seed(1)
    small = MIN_POSITION_BYTES // 4 // 2

    def state():   # every value new: each change is dense
        return {"w1": torch.randn(64, 1024, generator=g), "w2": torch.randn(128, 512, generator=g),
                **{f"b{i}": torch.randn(small, generator=g) for i in range(5)}}

    packs = tmp_path / "r" / "packs"

    def count() -> int:
        return sum(1 for p in packs.rglob("*") if p.is_file()) if packs.exists() else 0

    added = []
    with deltackpt.Repo(tmp_path / "r", create=True) as repo:
        for step in range(4):
            before = count()
            repo.save(state(), step=step)
            added.append(count() - before)
    assert added[2:] == [1, 1], added


def test_a_ctrl_c_during_an_inline_encode_stops_the_save_at_once_and_leaves_nothing(tmp_path, monkeypatch):
    """Encoding on the saving thread, a KeyboardInterrupt raised inside a chunk's encode ends the
    save there (not after the chunks a window still holds), and the save leaves no version, no
    pack and no temp file."""
    from deltackpt.repo.write import saver

    g = torch.Generator().manual_seed(2)
    state = {f"t{i}": torch.randn(2048, generator=g) for i in range(12)}   # 96 KiB: encoded inline
    calls: list[int] = []
    real = saver.encode_one

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    root = tmp_path / "r"
    with deltackpt.Repo(root, create=True) as repo:
        with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
            m.setattr(saver, "encode_one", interrupted)
            repo.save(state, step=0)
        assert len(calls) == 2
        assert repo.log() == []
    left = [p for folder in ("packs", "tmp", "index") for p in (root / folder).rglob("*") if p.is_file()]
    assert left == []
