"""Fuzz target: the manifest decoder (msgpack body, ext types, schema and bounds checks), and the
summary a listing decodes, which must accept every manifest the decoder accepts, alike."""

from __future__ import annotations

import _harness
from deltackpt.format import manifest


def TestOneInput(data: bytes) -> None:
    m = _harness.expect_typed(manifest.decode, data)
    s = _harness.expect_typed(manifest.decode_summary, data)
    if m is not None:
        # a manifest that decodes must describe views that fit their blobs: re-derive the sizes
        for t in m.tensors:
            assert t.blob < len(m.blobs)
            assert t.offset <= m.blobs[t.blob].nbytes
        # and what a listing shows of it (decode_summary) is what the whole decode says
        assert s is not None
        assert repr((s.parent, s.time, s.step, s.metrics, s.meta, s.extra, s.exact, s.logical_bytes, s.tree)) == repr(
            (m.parent, m.time, m.step, m.metrics, m.meta, m.extra, m.exact, sum(b.nbytes for b in m.blobs), m.tree))


if __name__ == "__main__":
    _harness.main(TestOneInput)
