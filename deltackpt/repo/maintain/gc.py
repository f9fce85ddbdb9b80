"""Garbage collection: remove versions outside the retention policy and the bytes only they held.

Order (each step leaves every kept version restorable if the process dies right after it):
1. take the exclusive gc lock (waits for running saves; new saves wait for gc), decide what goes
   (gc_plan.py);
2. under the refs lock, re-read the tags (plan again if one moved), delete tags of removed versions
   (only with keep_tags=False), then their manifests;
3. rewrite packs that are mostly dead into new packs (live objects copied byte for byte, or
   re-encoded as keyframes where their delta base is no longer needed: "rebased");
4. write one consolidated index, then delete the old index files;
5. delete packs no index refers to, and temp files, older than the grace period; then drill
   records beyond the newest 16 (events.py) and the holds of processes that are gone (holds.py);
6. deltify what the kept versions still hold whole (write/deltify.py, its own crash-safe order).
"""

from __future__ import annotations

from typing import Any, Iterator, Literal, overload

from ... import faults
from ...codecs import registry
from ...codecs.base import ChunkContext
from ...errors import ConflictError, CorruptObjectError
from ...format import index as index_fmt
from ...format.ids import hex_id
from ...format.limits import MAX_INDEX_BYTES, PACK_MAX_OBJECTS, PACK_TARGET_BYTES
from ...format.objects import EncodedObject
from ...format.pack import PackBuilder, PackEntry
from .. import locks
from ..layout import DEFAULT_GRACE_SECONDS as DEFAULT_GRACE_SECONDS, INDEX, MANIFESTS, TAGS, pack_key
from ..repository import Repository
from ..write.deltify import DEFAULT_LAG, deltify_locked
from ..write.session import WriteSession
from . import events, holds
from .gc_plan import GcPlan, GcReport as GcReport, plan_gc
from .retention import Retention


#: how often gc plans again because tags moved while it planned, before giving up
PLAN_RETRIES = 8


def run_gc(session: WriteSession, policy: Retention, *, dry_run: bool = False, rebase: bool = True,
           grace_seconds: float = DEFAULT_GRACE_SECONDS, deltify: bool = True) -> GcReport:
    """Apply ``policy`` to the repository of ``session`` (see the module docstring for the order);
    ``dry_run``: only estimate.  Rebased chunks are encoded at the session's level, and the
    deltification at the end remembers what was not worth it in the session.

    Example::

        report = run_gc(WriteSession(Repository("ckpt")), Retention(keep_last=3))
    """
    repo, level = session.repo, session.settings.level
    report = GcReport(dry_run=dry_run)
    repo.require_present()
    if dry_run:
        return _estimate(repo, policy, report, rebase, grace_seconds, level)

    # each step is durable before the next starts (module docstring's order)
    sync = getattr(repo.store, "sync_dir", None)
    with locks.gc_lock(repo.store, full_disk_ok=True) as restamp:
        p = _remove_versions(repo, policy, report, rebase, grace_seconds, sync)
        early = _drop_dead_packs(repo, p, sync)
        restamp()  # a lock taken empty on a full disk gets its holder's name now there is room

        new_packs: dict[str, tuple[int, list[PackEntry]]] = {}
        for data, entries in _repack(repo, p.rewrite, p.to_rebase, p.widths, level, with_entries=True):
            pid = hex_id(data)
            repo.store.put_atomic(pack_key(pid), data, site="gc.pack")
            new_packs[pid] = (len(data), entries)
        report.packs_rewritten = len({pid for pid, _ in p.rewrite} - set(p.keep_packs))

        index_bytes_saved = _write_one_index(repo, {**p.keep_packs, **new_packs}, sync)
        deleted_bytes = _delete_packs(repo, p, early, new_packs, report)
        _delete_temps(repo, p.now, grace_seconds, report)
        report.events_deleted = events.prune(repo)
        holds.break_stale(repo.store)
        new_bytes = sum(size for size, _ in new_packs.values())
        # net: negative when rebasing deltas into keyframes costs more than the removed versions held
        report.reclaimed_bytes = deleted_bytes - new_bytes + (p.old_bytes - sum(p.packs_on_disk.values())) + \
            index_bytes_saved
        repo.index.forget()
        repo.index.refresh()
        repo.chunks.decoded.clear()
        if deltify:
            # what the kept versions still hold whole becomes deltas, leaving the versions the
            # policy keeps only for now (keep_last) as they are: they are next to go
            d = deltify_locked(session, lag=max(DEFAULT_LAG, policy.keep_last or 0))
            report.chunks_deltified, report.deltified_bytes, report.deltify_freed_bytes = \
                d.chunks, d.written_bytes, d.freed_bytes
    return report


def _estimate(repo: Repository, policy: Retention, report: GcReport, rebase: bool, grace_seconds: float,
              level: int) -> GcReport:
    """``gc --dry-run``: a reader: no lock, nothing written (works on a read-only or full
    filesystem); a save running meanwhile can make the estimate stale, never wrong on disk."""
    p = plan_gc(repo, policy, report, rebase, grace_seconds)
    # build the rewritten packs in memory (rebased chunks re-encoded exactly as the real run does)
    # so the reclaimed bytes are the net change the real run makes, growth included
    new_packs = {hex_id(data): (len(data), entries)
                 for data, entries in _repack(repo, p.rewrite, p.to_rebase, p.widths, level, with_entries=True)}
    new_index = len(repo.encode_index({**p.keep_packs, **new_packs}))
    report.reclaimed_bytes = (p.old_bytes - sum(p.packs_on_disk.values())) + _index_bytes(repo) - new_index + \
        sum(p.packs_on_disk[pid] for pid in p.doomed) - sum(size for size, _ in new_packs.values())
    report.packs_deleted = len(p.doomed) - len(p.rewrite)
    report.packs_rewritten = len({pid for pid, _ in p.rewrite} - set(p.keep_packs))
    report.events_deleted = events.prune(repo, dry_run=True)
    return report


def _remove_versions(repo: Repository, policy: Retention, report: GcReport, rebase: bool,
                     grace_seconds: float, sync: Any) -> GcPlan:
    """Plan, then under the refs lock delete the removed versions' tags and manifests (durably,
    before any chunk they used goes); plan again while tags move.  Returns the plan acted on."""
    for _attempt in range(PLAN_RETRIES):
        p = plan_gc(repo, policy, report, rebase, grace_seconds)
        faults.hit("gc.mark")  # live set decided: everything after this deletes or rewrites
        # tags move under the refs lock alone: re-read them under it, so a tag set while gc
        # planned keeps its version (plan again), and one set later finds the version gone
        with locks.refs_lock(repo.store, full_disk_ok=True):
            if set(policy.select(repo)) != set(p.kept):
                continue
            report.tags_deleted = [] if policy.keep_tags else \
                [n for n, v in repo.tags().items() if v in p.removed]
            for name in report.tags_deleted:
                repo.store.delete(TAGS + name, site="gc.tag")
            for vid in p.removed:
                repo.store.delete(MANIFESTS + vid, site="gc.manifest")
                repo.forget_manifest(vid)
            if sync is not None:  # the removals are durable before any chunk they used goes
                sync(MANIFESTS, site="gc.dir")
                sync("refs/tags/", site="gc.dir")
        return p
    raise ConflictError(f"{repo.location}: tags kept changing while gc planned ({PLAN_RETRIES} tries); "
                        "nothing was deleted")


def _write_one_index(repo: Repository, packs: dict[str, tuple[int, list[PackEntry]]], sync: Any) -> int:
    """Write one index naming ``packs``, then delete every other index file (durably); return the
    bytes this saves (the old files' total less the new one's size)."""
    old_index_files = repo.store.list(INDEX)
    old_index_bytes = _index_bytes(repo)
    index_data = repo.encode_index(packs)
    index_key = INDEX + hex_id(index_data)
    repo.store.put_atomic(index_key, index_data, site="gc.index")
    for key in old_index_files:
        if key != index_key:
            repo.store.delete(key, site="gc.index.delete")
    if sync is not None:  # no old index file may reappear after a crash naming a pack deleted below
        sync(INDEX, site="gc.dir")
    return old_index_bytes - len(index_data)


def _delete_packs(repo: Repository, p: GcPlan, early: set[str], new_packs: dict[str, Any],
                  report: GcReport) -> int:
    """Delete the doomed packs not already gone (``early``) or rewritten under the same name;
    return the bytes they held, counting the early ones."""
    deleted_bytes = sum(p.packs_on_disk[pid] for pid in early)
    report.packs_deleted += len(early)
    for pid in p.doomed:
        if pid in new_packs or pid in early:
            continue
        try:
            repo.store.delete(pack_key(pid), site="gc.delete")
            deleted_bytes += p.packs_on_disk[pid]
            report.packs_deleted += 1
        except FileNotFoundError:
            pass
    return deleted_bytes


def _delete_temps(repo: Repository, now: float, grace_seconds: float, report: GcReport) -> None:
    temp_lister = getattr(repo.store, "temp_files", None)
    if temp_lister is not None:
        for key, mtime in temp_lister():
            if now - mtime >= grace_seconds:
                repo.store.delete(key, site="gc.temp")
                report.temps_deleted += 1


def _drop_dead_packs(repo: Repository, p: GcPlan, sync: Any) -> set[str]:
    """Before gc writes anything (a full disk has no room for new packs or a new index): delete the
    index files naming only packs with no live object, then the packs no remaining index file names
    (and the doomed unindexed ones).  Every live chunk stays reachable through another index file.
    Returns the packs deleted."""
    dead = set(p.doomed) - {pid for pid, _ in p.rewrite}
    # rebasing a chunk decodes it through its old base chain: keep every pack holding a link of it
    dead -= {pid for cid in repo.index.chunk_closure(p.to_rebase) for pid, _ in repo.index.entries_for(cid)}
    drop_keys: list[str] = []
    still_named: set[str] = set()
    for key in repo.store.list(INDEX):
        try:
            packs = set(index_fmt.decode(repo.store.get_bounded(key, MAX_INDEX_BYTES), what=key))
        except (CorruptObjectError, FileNotFoundError):
            return set()  # changed since the plan read it: leave everything to the main pass
        if packs <= dead:
            drop_keys.append(key)
        else:
            still_named |= packs
    for key in drop_keys:
        repo.store.delete(key, site="gc.index.delete")
    if drop_keys and sync is not None:  # no dropped index file may reappear naming a pack deleted below
        sync(INDEX, site="gc.dir")
    gone = dead - still_named
    for pid in sorted(gone):
        repo.store.delete(pack_key(pid), site="gc.delete")
    return gone


def _index_bytes(repo: Repository) -> int:
    total = 0
    for key in repo.store.list(INDEX):
        try:
            total += repo.store.size(key)
        except FileNotFoundError:
            pass
    return total


@overload
def _repack(repo: Repository, rewrite: list[tuple[str, list[PackEntry]]], to_rebase: set[bytes],
            widths: dict[bytes, int], level: int, with_entries: Literal[True]) -> Iterator[tuple[bytes, list[PackEntry]]]:
    ...


@overload
def _repack(repo: Repository, rewrite: list[tuple[str, list[PackEntry]]], to_rebase: set[bytes],
            widths: dict[bytes, int], level: int, with_entries: Literal[False] = False) -> Iterator[bytes]:
    ...


def _repack(repo: Repository, rewrite: list[tuple[str, list[PackEntry]]], to_rebase: set[bytes],
            widths: dict[bytes, int], level: int,
            with_entries: bool = False) -> Iterator[bytes | tuple[bytes, list[PackEntry]]]:
    """Yield the bytes of the new packs holding the live objects of ``rewrite`` (objects whose
    delta base goes away are re-encoded as keyframes), and their entries when asked."""
    builder = PackBuilder()
    for pid, entries in rewrite:
        for e in entries:
            if e.chunk_id in to_rebase:
                raw = repo.chunks.read_chunk(e.chunk_id)
                enc = registry.get(registry.BG_ZSTD).encode(raw, ChunkContext("uint8", widths.get(e.chunk_id, 1), 0, level))
                assert enc is not None   # zstd takes every chunk
                codec_id, params, payload = registry.BG_ZSTD, enc.params, enc.payload
                if len(payload) >= len(raw):
                    # read_chunk returns any bytes-like (a numpy array, lately): bytes to concatenate
                    codec_id, params, payload = registry.RAW, {}, bytes(memoryview(raw).cast("B"))
                obj = EncodedObject(codec_id, e.raw_len, params, bytes(payload)).to_bytes()
                builder.add(e.chunk_id, obj, encoding=codec_id, raw_len=e.raw_len, base=None, depth=0)
            else:
                obj = repo.store.get(pack_key(pid), e.offset, e.length)
                builder.add(e.chunk_id, obj, encoding=e.encoding, raw_len=e.raw_len, base=e.base, depth=e.depth)
            if builder.size >= PACK_TARGET_BYTES or len(builder) >= PACK_MAX_OBJECTS:
                yield (builder.finish(), list(builder.entries)) if with_entries else builder.finish()
                builder = PackBuilder()
    if len(builder):
        yield (builder.finish(), list(builder.entries)) if with_entries else builder.finish()
