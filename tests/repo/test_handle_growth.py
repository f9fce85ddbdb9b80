"""What a handle keeps as the history grows: a few decoded manifests (the heads of the others:
time, parent, step, metrics), and of deltification only what concerns the versions the step after a
save looks at (deltify.step_window).  A handle that kept everything grew by about a manifest and
a version's positions per save, and each step walked every version."""

from __future__ import annotations

import torch

import deltackpt
from deltackpt.repo.repository import MANIFESTS_KEPT, Repository
from deltackpt.repo.write.deltify import step_window


def test_a_long_run_keeps_a_bounded_handle(tmp_path):
    path = str(tmp_path / "r")
    g = torch.Generator().manual_seed(0)
    table = torch.randn(4096, 64, generator=g)
    saves = 40
    with deltackpt.Repo(path, create=True, keyframe_interval=2, chunk_bytes=1 << 16, deltify=True) as repo:
        for step in range(saves):
            table[torch.randint(0, 4096, (20,), generator=g)] += 0.01   # sparse: every step has work
            repo.save({"emb": table}, step=step, metrics={"loss": 1.0 / (step + 1)})
        core, memo = repo.core, repo.session.deltify_memo
        window = step_window(2)
        assert window + 1 < saves
        assert len(core._manifests) <= MANIFESTS_KEPT < saves
        assert len(memo.positions) <= 1 + window   # the newest, left alone, and the window
        assert set(memo.settled.values()) <= set(memo.positions)
        # the history, retention's fields and the log read the same as a fresh handle's
        fresh = Repository(path)
        assert core.history_order() == fresh.history_order()
        assert [core.head(v) for v in core.history_order()] == [fresh.head(v) for v in fresh.history_order()]
        assert [v.step for v in repo.log()] == list(range(saves - 1, -1, -1))
        kept = repo.gc(keep_best="loss:2", keep_last=1)
        assert sorted(core.head(v).step for v in kept.kept) == [saves - 2, saves - 1]
    assert torch.equal(deltackpt.load(path)["emb"], table)
