"""Fuzz target: the manifest decoder (msgpack body, ext types, schema and bounds checks)."""

from __future__ import annotations

import _harness
from deltackpt.format import manifest


def TestOneInput(data: bytes) -> None:
    m = _harness.expect_typed(manifest.decode, data)
    if m is not None:
        # a manifest that decodes must describe views that fit their blobs: re-derive the sizes
        for t in m.tensors:
            assert t.blob < len(m.blobs)
            assert t.offset <= m.blobs[t.blob].nbytes


if __name__ == "__main__":
    _harness.main(TestOneInput)
