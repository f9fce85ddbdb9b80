"""Keeping the number of index files small, so that opening a repository costs a bounded number of
reads, not one per save.

Each save writes one index file, and gc replaces them all by one; a repository that saves often and
collects rarely would otherwise make every new process list and parse hundreds of small files.
After a save (or deltification) finds more than ``MAX_INDEX_FILES``, the small ones are merged into
one: every file but the largest, or all of them once the largest is no larger than the rest
together (the largest file is rewritten only when the others have grown as large: each entry is
rewritten O(log n) times over a repository's life, as with git's geometric repacking).

Order, under the refs lock (so it never races deltification's or another save's replacement):
write the merged file (durable), delete the files it replaces, fsync ``index/``.  A crash in
between leaves both, naming the same packs: readers take the union of index files, so duplicates
are harmless, and the next run merges them again.  It runs inside a save lock, so gc is not running.
"""

from __future__ import annotations

from ...format import index as index_fmt
from ...format.ids import hex_id
from ...format.limits import MAX_INDEX_BYTES
from ...format.pack import PackEntry
from .. import locks
from ..layout import INDEX
from ..repository import Repository

#: merge index files once a repository holds more than this many
MAX_INDEX_FILES = 16


def consolidate(repo: Repository, *, max_files: int = MAX_INDEX_FILES) -> int:
    """Merge the small index files when there are more than ``max_files``; returns how many went."""
    if len(repo.index.file_packs) <= max_files:
        return 0
    store = repo.store
    with locks.refs_lock(store):
        repo.index.refresh()
        keys = sorted(k for k in repo.index.file_packs if k not in repo.index.bad_files)
        if len(keys) <= max_files:
            return 0
        sizes = {k: store.size(k) for k in keys}
        largest = max(keys, key=lambda k: (sizes[k], k))
        chosen = keys if sizes[largest] <= sum(sizes.values()) - sizes[largest] else \
            [k for k in keys if k != largest]
        merged: dict[str, tuple[int, list[PackEntry]]] = {}
        for key in chosen:
            body = index_fmt.decode(store.get_bounded(key, MAX_INDEX_BYTES), what=key)
            for pid, (plen, entries) in body.items():
                have = merged.setdefault(pid, (plen, []))[1]
                seen = {(e.chunk_id, e.offset) for e in have}
                have.extend(e for e in entries if (e.chunk_id, e.offset) not in seen)
        data = repo.encode_index(merged)
        new_key = INDEX + hex_id(data)
        store.put_atomic(new_key, data, site="consolidate.index")
        gone = [k for k in chosen if k != new_key]
        for key in gone:
            store.delete(key, site="consolidate.delete")
        sync = getattr(store, "sync_dir", None)
        if sync is not None:
            sync(INDEX, site="consolidate.dir")
        repo.index.replace_files(gone, {new_key: merged})
    return len(gone)
