"""Dropping the keyframes that deltification re-stored as reverse deltas (deltify.py).

Once an older chunk has a delta copy, its keyframe is redundant, so the packs holding those
keyframes can go, with no full gc.  A pack is dropped only when every object in it is still
readable another way without it: its chunk resolves through other copies (copies.py) in packs that
exist, and a chunk the newest versions use keeps its copy, so ``latest`` reads as saved.  A pack
that is mostly redundant but still holds needed objects (the first version's pack, of which a
fine-tune changes one layer) is rewritten: the needed objects are copied byte for byte into a new
pack first.

Order, each step durable before the next, so a crash anywhere leaves every committed version
readable (at worst an unindexed pack, which gc removes after its grace period):
1. write the new pack (if any), then the index files that replace those naming a dropped pack;
2. delete the replaced index files, fsync ``index/``;
3. delete the dropped packs.
All of it runs under the refs lock, so two writers never drop packs on the strength of each
other's copies, and inside a save lock (or gc's), so gc is not running.
"""

from __future__ import annotations

from typing import Mapping

from ...format import index as index_fmt
from ...format.ids import hex_id
from ...format.limits import MAX_INDEX_BYTES
from ...format.pack import PackBuilder, PackEntry
from .. import locks
from ..layout import INDEX, PACKS, pack_key
from ..repository import Repository

#: rewrite a pack once this much of it is redundant: each byte a rewrite copies then frees at least one
REWRITE_DEAD_FRACTION = 0.5
_NEW = "new"                   # the pack being built, while planning


def _plan(repo: Repository, candidates: set[str], protected: set[bytes],
          on_disk: set[str]) -> dict[str, list[PackEntry]]:
    """For each candidate pack, the objects that must survive its removal (copied elsewhere).
    Only copies in packs ``on_disk`` count: the index outlives a lost pack, and counting its copies
    would drop the only readable one.

    Kept objects are chosen outward from what already resolves: each round keeps the objects of
    chunks that have no copy outside the candidates, then resolves again, so that a chunk whose
    delta elsewhere reads through one kept keyframe is not kept as well (keeping every unresolved
    object at once would keep whole packs of redundant keyframes).  Only when no round makes
    progress (copies elsewhere that resolve only through each other) is every object that would
    resolve kept."""
    unusable = candidates | (set(repo.index.pack_entries) - on_disk)
    usable = lambda pid: pid not in unusable  # noqa: E731
    keep: dict[str, list[PackEntry]] = {pid: [] for pid in candidates}
    kept: set[tuple[str, int]] = set()
    strict = True
    while True:  # keeping an object can only make more chunks resolve: this settles
        extra = [(e.chunk_id, (_NEW, e)) for entries in keep.values() for e in entries]
        res = repo.index.resolve_without(unusable, extra)
        grew = False
        for pid in sorted(candidates):
            for e in repo.index.pack_entries.get(pid, ()):
                if (pid, e.offset) in kept:
                    continue
                depth = res.depth.get(e.chunk_id)
                if depth is not None and not (depth > 0 and e.chunk_id in protected):
                    continue
                if e.base is not None and e.base not in res.depth:
                    continue  # it would not resolve yet: wait until its base does
                if strict and depth is None and any(usable(q) for q, _e in repo.index.entries_for(e.chunk_id)):
                    continue  # a copy elsewhere may resolve once other chunks do
                keep[pid].append(e)
                kept.add((pid, e.offset))
                grew = True
        if grew:
            strict = True
        elif strict:
            strict = False
        else:
            break
    # a chunk still unresolved has no copy that resolves at all: keep every one (verify reports it)
    res = repo.index.resolve_without(unusable, [(e.chunk_id, (_NEW, e)) for entries in keep.values() for e in entries])
    for pid in candidates:
        keep[pid].extend(e for e in repo.index.pack_entries.get(pid, ())
                         if (pid, e.offset) not in kept and e.chunk_id not in res.depth)
    return keep


def drop_superseded(repo: Repository, restored: Mapping[bytes, bytes], protected: set[bytes]) -> tuple[int, int]:
    """Remove the packs whose copies of ``restored`` chunks ({chunk: the base of its new copy}) are
    now redundant; ``protected``: chunks whose copy must stay as it is (those the newest versions
    read).  Returns (bytes deleted, bytes written): the packs and index files each side, so the
    repository shrinks by the difference."""
    store = repo.store
    with locks.refs_lock(store):
        repo.index.refresh()
        on_disk = {key.rsplit("/", 1)[-1] for key in store.list(PACKS)}
        candidates = {pid for cid, base in restored.items() for pid, e in repo.index.entries_for(cid)
                      if e.base != base and pid in on_disk}
        if not candidates:
            return 0, 0
        keep = _plan(repo, candidates, protected, on_disk)
        raw = {key: store.get_bounded(key, MAX_INDEX_BYTES)
               for key, named in repo.index.file_packs.items() if named & candidates}
        files = {key: index_fmt.decode(data, what=key) for key, data in raw.items()}
        sizes = {pid: plen for body in files.values() for pid, (plen, _) in body.items()}
        builder = PackBuilder()
        drop = _choose_drops(repo, candidates, keep, sizes, builder)
        if not drop:
            return 0, 0
        new_packs: dict[str, tuple[int, list[PackEntry]]] = {}
        if len(builder):
            data = builder.finish()
            new_packs[hex_id(data)] = (len(data), list(builder.entries))
            store.put_atomic(pack_key(hex_id(data)), data, site="supersede.pack")
        written = sum(plen for plen, _ in new_packs.values())
        replaced, added, index_written = _write_replacements(repo, files, drop, new_packs)
        for key in replaced:
            store.delete(key, site="supersede.index.delete")
        sync = getattr(store, "sync_dir", None)
        if sync is not None:  # no replaced index file may come back after a crash naming a dropped pack
            sync(INDEX, site="supersede.dir")
        freed = sum(len(raw[key]) for key in replaced)
        for pid in sorted(drop):
            try:
                store.delete(pack_key(pid), site="supersede.delete")
                freed += sizes[pid]
            except FileNotFoundError:
                pass
        repo.index.replace_files(replaced, added)
        return freed, written + index_written


def _choose_drops(repo: Repository, candidates: set[str], keep: dict[str, list[PackEntry]],
                  sizes: dict[str, int], builder: PackBuilder) -> set[str]:
    """The candidate packs to drop (those mostly redundant), their needed objects copied into
    ``builder`` byte for byte."""
    drop: set[str] = set()
    for pid in sorted(candidates):
        kept, size = keep[pid], sizes.get(pid)
        if size is None:
            continue
        if kept and size - sum(e.length for e in kept) < REWRITE_DEAD_FRACTION * size:
            continue  # mostly needed: leave it
        for e in kept:
            builder.add(e.chunk_id, repo.store.get(pack_key(pid), e.offset, e.length), encoding=e.encoding,
                        raw_len=e.raw_len, base=e.base, depth=e.depth)
        drop.add(pid)
    return drop


def _write_replacements(repo: Repository, files: dict[str, dict[str, tuple[int, list[PackEntry]]]], drop: set[str],
                        new_packs: dict[str, tuple[int, list[PackEntry]]],
                        ) -> tuple[list[str], dict[str, dict[str, tuple[int, list[PackEntry]]]], int]:
    """Write an index file for each one naming a dropped pack: the same packs less the dropped
    ones (the first also names ``new_packs``).  Returns the files replaced, those written and their
    bytes."""
    replaced: list[str] = []
    written = 0
    added: dict[str, dict[str, tuple[int, list[PackEntry]]]] = {}
    for key, body in sorted(files.items()):
        if not set(body) & drop:
            continue
        rest = {pid: v for pid, v in body.items() if pid not in drop}
        rest.update(new_packs)
        new_packs = {}  # named once, by the first replacement
        if rest:
            out = repo.encode_index(rest)
            new_key = INDEX + hex_id(out)
            repo.store.put_atomic(new_key, out, site="supersede.index")
            added[new_key] = rest
            written += len(out)
        replaced.append(key)
    return replaced, added, written
