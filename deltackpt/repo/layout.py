"""Where things live in a repository's store (spec/FORMAT.md, "Layout")."""

from __future__ import annotations

CONFIG = "config"
PACKS = "packs/"
INDEX = "index/"
MANIFESTS = "manifests/"
LATEST_REF = "refs/latest"
TAGS = "refs/tags/"
EVENTS = "events/"
DEFAULT_DELTA_CACHE_BYTES = 4 << 30
DEFAULT_DECODED_CACHE_BYTES = 256 << 20
DEFAULT_DELTIFY_LAG = 1   # the newest versions deltification leaves as saved (deltify.py)


def pack_key(pack_id: str) -> str:
    return f"{PACKS}{pack_id[:2]}/{pack_id}"
