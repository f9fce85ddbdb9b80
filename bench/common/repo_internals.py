"""The one place the bench reads deltackpt's internals, read-only, for figures no public API gives
yet: how many objects a read decodes per chunk (the chunk's object and every delta base it names)
(``Repo.info()`` now gives the configured topology).  Everything else
in bench/ goes through ``deltackpt.save/load/restore/gc``, ``deltackpt.Repo`` and
``deltackpt.store``.  When the library exposes these (``Repo.show`` or a ``Repo.config``), this
module goes.
"""

from __future__ import annotations

import statistics
from typing import Any


def open_counted(path: str) -> tuple[Any, Any]:
    """A fresh ``deltackpt.Repo`` over a ``CountingStore`` of the repository at ``path``, and that
    store (``bytes_read``: what the handle fetched): what a restarted process sees, nothing decoded
    or indexed in memory.  Public API; here because every study that counts reads uses it."""
    import deltackpt
    from deltackpt.store import CountingStore, LocalStore
    cs = CountingStore(LocalStore(path))
    return deltackpt.Repo(cs), cs


def config(repo: Any) -> dict[str, Any]:
    """The repository's ``keyframe_interval``, ``delta_base`` and ``chunk_bytes`` (``Repo.info()``)."""
    c = repo.info()
    return {"keyframe_interval": c["keyframe_interval"], "delta_base": c["delta_base"], "chunk_bytes": c["chunk_bytes"]}


def objects_per_chunk(repo: Any, revision: str = "latest") -> tuple[float, int]:
    """Mean and max, over the version's chunk references, of the objects a read decodes: the
    chunk's object and every base it names, followed through the index whatever the topology.
    INTERNAL: walks ``repo.core``'s manifest and index."""
    core = repo.core
    core.index.refresh()
    counts = []
    for b in core.manifest(core.resolve(revision)).blobs:
        for c in b.chunks:
            n, cid = 0, c.chunk_id
            while cid is not None:
                n += 1
                cid = core.index.entry(cid)[1].base
            counts.append(n)
    return (statistics.mean(counts), max(counts)) if counts else (0.0, 0)


def max_depth(repo: Any, revision: str) -> int:
    """The deepest delta chain among the version's chunks (0: all keyframes).  INTERNAL: reads
    ``repo.core``'s index entries."""
    core = repo.core
    core.index.refresh()
    m = core.manifest(core.resolve(revision))
    return max((core.index.entry(c.chunk_id)[1].depth for b in m.blobs for c in b.chunks), default=0)


def delta_bases() -> tuple[str, ...]:
    """The ``delta_base`` values this deltackpt accepts.  INTERNAL: reads
    ``deltackpt.format.config.DELTA_BASES``."""
    from deltackpt.format import config as cfg
    return tuple(getattr(cfg, "DELTA_BASES", ("parent", "keyframe")))
