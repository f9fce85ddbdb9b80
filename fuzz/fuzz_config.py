"""Fuzz target: the repository config decoder (format name, version, parameters)."""

from __future__ import annotations

import _harness
from deltackpt.format import config


def TestOneInput(data: bytes) -> None:
    cfg = _harness.expect_typed(config.decode, data, where="fuzz")
    if cfg is not None:
        assert 1 <= cfg.chunk_bytes and 0 <= cfg.keyframe_interval <= 1024


if __name__ == "__main__":
    _harness.main(TestOneInput)
