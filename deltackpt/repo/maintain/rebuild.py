"""Rebuild the index from the packs: every pack carries its own header, so the index is derived data.

Use it after ``verify`` reports a damaged or missing index file::

    from deltackpt.repo.maintain.rebuild import rebuild_index
    report = rebuild_index(repo.core)        # repo = deltackpt.Repo(path)
    assert repo.verify().ok

It reads only each pack's trailer and header (two ranged reads per pack), writes one consolidated
index file, and deletes the index files that existed before (damaged or not: the new file covers
every pack).  It holds the exclusive gc lock, so no save or gc interleaves.  A pack whose header
cannot be parsed is skipped and reported; its chunks stay unindexed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import DeltackptError
from ...format.ids import from_hex, hex_id
from ...format.pack import PackEntry
from .. import locks
from ..layout import INDEX, PACKS, pack_key
from ..read import packfile
from ..repository import Repository


@dataclass
class RebuildReport:
    """What :func:`rebuild_index` did."""

    index_key: str = ""
    packs_indexed: int = 0
    chunks_indexed: int = 0
    packs_skipped: dict[str, str] = field(default_factory=dict)  # pack key -> why
    removed_index_files: list[str] = field(default_factory=list)


def rebuild_index(repo: Repository) -> RebuildReport:
    """Re-derive the whole index from the pack headers and replace every index file with one."""
    report = RebuildReport()
    with locks.gc_lock(repo.store):
        old_files = repo.store.list(INDEX)
        packs: dict[str, tuple[int, list[PackEntry]]] = {}
        for key in repo.store.list(PACKS):
            pid = key.rsplit("/", 1)[-1]
            try:
                from_hex(pid)
                if key != pack_key(pid):
                    raise DeltackptError(f"{key!r} is not where pack {pid} belongs")
                packs[pid] = packfile.read_entries(repo.store, pid)
            except DeltackptError as exc:
                report.packs_skipped[key] = str(exc)
        data = repo.encode_index(packs)
        report.index_key = INDEX + hex_id(data)
        repo.store.put_atomic(report.index_key, data, site="rebuild.index")
        for key in old_files:
            if key != report.index_key:
                repo.store.delete(key, site="rebuild.index.delete")
                report.removed_index_files.append(key)
        repo.store.sync_dir(INDEX, site="rebuild.dir") if hasattr(repo.store, "sync_dir") else None
        report.packs_indexed = len(packs)
        report.chunks_indexed = sum(len(entries) for _, entries in packs.values())
        repo.index.forget()
        repo.index.refresh()
    return report
