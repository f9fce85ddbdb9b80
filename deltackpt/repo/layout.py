"""Where things live in a repository's store (spec/FORMAT.md, "Layout")."""

from __future__ import annotations

CONFIG = "config"
PACKS = "packs/"
INDEX = "index/"
MANIFESTS = "manifests/"
LATEST_REF = "refs/latest"
TAGS = "refs/tags/"
EVENTS = "events/"
#: a handle's delta cache holds at most this fraction of the state it last saved, unless given a size
#: (bench/MAINTENANCE.md, "Memory": what the cache buys against what it holds)
DEFAULT_DELTA_CACHE_FRACTION = 0.1
DEFAULT_DECODED_CACHE_BYTES = 256 << 20
DEFAULT_DELTIFY_LAG = 1   # the newest versions deltification leaves as saved (deltify.py)
#: how old a pack no index names must be before gc deletes it: it may belong to a save still
#: running in another process (maintain/gc.py)
DEFAULT_GRACE_SECONDS = 600.0


def pack_key(pack_id: str) -> str:
    return f"{PACKS}{pack_id[:2]}/{pack_id}"
