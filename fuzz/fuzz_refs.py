"""Fuzz target: ref files (``decode_ref``), tag names (``check_name``) and revisions (``parse_revision``).

The same bytes go to all three: as a ref file's content, and decoded (UTF-8, invalid bytes kept
as surrogates) as a name and as a revision.  A name that passes ``check_name`` must also be a
valid store key, since it becomes ``refs/tags/<name>``.
"""

from __future__ import annotations

import _harness
from deltackpt.format import refs
from deltackpt.store.base import check_key


def _name(text: str) -> None:
    for kind in ("tag", "ref"):
        name = refs.check_name(text, kind=kind)
        check_key("refs/tags/" + name)  # raises StoreError (typed) if a valid name were an unsafe key
        assert "/" not in name and ".." not in name and not name.startswith(".")


def TestOneInput(data: bytes) -> None:
    vid = _harness.expect_typed(refs.decode_ref, data, what="fuzz ref")
    if vid is not None:
        assert len(vid) == 32
    text = data.decode("utf-8", "surrogateescape")
    _harness.expect_typed(_name, text)
    rev = _harness.expect_typed(refs.parse_revision, text)
    if rev is not None:
        assert rev.back >= 0 and rev.base


if __name__ == "__main__":
    _harness.main(TestOneInput)
