"""A save hands the manifest it committed to its handle's cache (the step after the save and the
next save use it instead of reading it back): what the handle keeps must be exactly what a reader
decodes from the committed bytes, for every field a save fills."""

from __future__ import annotations

import numpy as np
import torch

import deltackpt
from deltackpt.format import manifest as manifest_fmt
from deltackpt.repo import repository
from deltackpt.repo.layout import MANIFESTS


def test_the_remembered_manifest_is_what_the_committed_bytes_decode_to(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(300, 70, generator=g), "h": torch.randn(64, generator=g).half(),
             "i": torch.arange(9), "nested": {"t": (torch.ones(3), 2.5, "x", None)}}
    with deltackpt.Repo(tmp_path / "r", create=True) as repo:
        saves = [dict(step=1, metrics={"loss": np.float32(0.25)}, meta={"a": [1, (2, 3)], "b": bytearray(b"x")}),
                 dict(step=2, tag="warmup-done", encoding={"w": "q8-delta"}),
                 dict(step=3, meta=("x", 1))]
        for kw in saves:
            state["w"].add_(0.01)
            v = repo.save(state, **kw)
            decoded: list[str] = []
            with monkeypatch.context() as m:   # the handle's own copy, not one read back
                m.setattr(repository.manifest_fmt, "decode", lambda *a, **k: decoded.append("x"))
                kept = repo.core.manifest(v.id)
            assert decoded == []
            read_back = manifest_fmt.decode(repo.core.store.get(MANIFESTS + v.id), version_id=v.id)
            assert kept == read_back
            assert repr(kept) == repr(read_back)
