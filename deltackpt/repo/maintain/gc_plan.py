"""gc's first step: read the index, manifests and refs once and decide what goes (the versions
outside the retention policy, the chunks only they need, the packs to keep, rewrite or delete).
Nothing here writes; gc.py acts on the plan in its crash-safe order.  The report gc returns
(:class:`GcReport`) is defined here, where planning starts filling it, so gc.py imports this module
and never the other way round."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import CorruptObjectError
from ...format.pack import PackEntry
from ..layout import MANIFESTS, PACKS, pack_key
from ..repository import Repository
from .retention import Retention

REPACK_DEAD_FRACTION = 0.2


@dataclass
class GcReport:
    """What gc removed (or would remove, with ``dry_run``)."""

    dry_run: bool
    kept: dict[str, list[str]] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    reclaimed_bytes: int = 0
    packs_deleted: int = 0
    packs_rewritten: int = 0
    chunks_rebased: int = 0
    bases_kept: int = 0
    temps_deleted: int = 0
    chunks_deltified: int = 0      # kept keyframes re-stored as deltas against newer chunks (deltify.py)
    deltified_bytes: int = 0       # the bytes deltification wrote (its deltas, objects of packs it rewrote)
    deltify_freed_bytes: int = 0   # and the pack bytes it removed; not in reclaimed_bytes (gc's own,
                                   # which a dry run reports exactly): the disk's change adds both
    events_deleted: int = 0
    tags_deleted: list[str] = field(default_factory=list)
    steps: dict[str, int | None] = field(default_factory=dict)  # version id -> step, for reports

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "kept": self.kept, "removed": self.removed,
                "reclaimed_bytes": self.reclaimed_bytes, "packs_deleted": self.packs_deleted,
                "packs_rewritten": self.packs_rewritten, "chunks_rebased": self.chunks_rebased,
                "bases_kept": self.bases_kept, "temps_deleted": self.temps_deleted,
                "chunks_deltified": self.chunks_deltified, "deltified_bytes": self.deltified_bytes,
                "deltify_freed_bytes": self.deltify_freed_bytes,
                "events_deleted": self.events_deleted,
                "tags_deleted": self.tags_deleted, "steps": self.steps}


def _pack_files(repo: Repository) -> dict[str, int]:
    out = {}
    for key in repo.store.list(PACKS):
        pid = key.rsplit("/", 1)[-1]
        if len(pid) == 32:
            try:
                out[pid] = repo.store.size(key)
            except FileNotFoundError:
                pass
    return out


@dataclass
class GcPlan:
    """What a gc run deletes and rewrites, decided from one reading of the repository."""

    kept: dict[str, list[str]]
    removed: list[str]
    rewrite: list[tuple[str, list[PackEntry]]]
    to_rebase: set[bytes]
    widths: dict[bytes, int]
    keep_packs: dict[str, tuple[int, list[PackEntry]]]
    packs_on_disk: dict[str, int]
    doomed: list[str]
    old_bytes: int
    now: float


def plan_gc(repo: Repository, policy: Retention, report: GcReport, rebase: bool, grace_seconds: float) -> GcPlan:
    """Read the index, manifests and refs and decide what goes (fills ``report``'s kept/removed)."""
    repo.index.refresh()
    if repo.index.bad_files:
        # the damaged files' packs would look unreferenced and be deleted: refuse instead
        raise CorruptObjectError(f"{repo.location}: damaged index files {sorted(repo.index.bad_files)}; "
                                 "run rebuild_index before gc")
    kept = policy.select(repo)
    all_versions = repo.version_ids()
    removed = [v for v in all_versions if v not in kept]
    report.kept, report.removed = kept, removed
    report.steps = {v: repo.head(v).step for v in all_versions}

    direct, widths = _kept_chunks(repo, kept)
    packs_on_disk = _pack_files(repo)
    # a chunk may be indexed in several packs (concurrent saves, an interrupted gc): use the
    # shallowest copy whose pack exists, and never write an index that drops a chunk a kept
    # version needs
    by_pack: dict[str, list[PackEntry]] = repo.index.pack_entries
    # the copy with the shortest real chain among packs that exist (copies.py): recorded depths go
    # stale, and two copies may name each other as bases
    chosen = repo.index.resolve_copies(packs_on_disk.__contains__).best
    live, to_rebase = _live_set(repo, kept, direct, chosen, rebase)
    report.bases_kept = len(live - direct)
    report.chunks_rebased = len(to_rebase)
    keep_packs, rewrite = _sort_packs(by_pack, packs_on_disk, live, chosen, to_rebase)
    delete_packs = [pid for pid in packs_on_disk if pid not in keep_packs]
    old_bytes = sum(packs_on_disk.values())
    for vid in removed:
        try:
            old_bytes += repo.store.size(MANIFESTS + vid)
        except FileNotFoundError:
            pass
    report.tags_deleted = [] if policy.keep_tags else [n for n, v in repo.tags().items() if v in removed]

    now = time.time()
    doomed = _doomed_packs(repo, delete_packs, by_pack, now, grace_seconds)
    return GcPlan(kept, removed, rewrite, to_rebase, widths, keep_packs, packs_on_disk, doomed, old_bytes, now)


def _kept_chunks(repo: Repository, kept: dict[str, list[str]]) -> tuple[set[bytes], dict[bytes, int]]:
    """The chunks the kept versions' manifests name directly, and each one's element width."""
    direct: set[bytes] = set()
    widths: dict[bytes, int] = {}
    for vid in kept:
        for blob in repo.manifest(vid).blobs:
            for c in blob.chunks:
                direct.add(c.chunk_id)
                widths[c.chunk_id] = blob.itemsize
    return direct, widths


def _live_set(repo: Repository, kept: dict[str, list[str]], direct: set[bytes],
              chosen: dict[bytes, tuple[str, PackEntry]], rebase: bool) -> tuple[set[bytes], set[bytes]]:
    """Every chunk a kept version needs through the chosen copies' delta chains, and the deltas
    to re-encode as keyframes because their base is needed by nothing else."""
    # a keyframe that several kept deltas use as their base (lossless deltas form a star
    # around their keyframe) is cheaper to keep than to rebase every one of them
    users_of: dict[bytes, int] = {}
    for cid in direct:
        base = chosen[cid][1].base if cid in chosen else None
        if base is not None and base not in direct:
            users_of[base] = users_of.get(base, 0) + 1
    shared = {b for b, n in users_of.items() if n >= 2 and b in chosen and chosen[b][1].base is None}
    to_rebase: set[bytes] = set()
    live: set[bytes] = set()
    pending = list(direct)
    while pending:
        cid = pending.pop()
        if cid in live:
            continue
        live.add(cid)
        if cid not in chosen:
            users = [v[:10] for v in kept if any(c.chunk_id == cid for b in repo.manifest(v).blobs for c in b.chunks)]
            raise CorruptObjectError(f"gc stopped before deleting anything: chunk {cid.hex()} "
                                     f"(needed by {', '.join(users) or 'a delta chain'}) is in no pack; "
                                     "run `deltackpt verify`; after a lost index file, rebuild_index (`deltackpt rebuild-index`)")
        base = chosen[cid][1].base
        # a delta whose base only other deltas needed is re-encoded whole, so the base can go; not
        # when that base is a keyframe: keeping it costs what the rebased keyframe would, and
        # writes nothing (a chain's anchor whose version retention dropped)
        if (base is not None and base not in direct and base not in shared and rebase
                and base in chosen and chosen[base][1].base is not None):
            to_rebase.add(cid)
        elif base is not None:
            pending.append(base)
    return live, to_rebase


def _sort_packs(by_pack: dict[str, list[PackEntry]], packs_on_disk: dict[str, int], live: set[bytes],
                chosen: dict[bytes, tuple[str, PackEntry]], to_rebase: set[bytes],
                ) -> tuple[dict[str, tuple[int, list[PackEntry]]], list[tuple[str, list[PackEntry]]]]:
    """Split the indexed packs holding live copies into those kept as they are and those rewritten
    (mostly dead).  A chunk to rebase is re-encoded into the new packs either way; a pack kept
    holds its old object unindexed (a delta with one chunk to rebase does not cost rewriting
    every other object of its pack: a version's whole keyframe set, in a dense fine-tune)."""
    keep_packs: dict[str, tuple[int, list[PackEntry]]] = {}
    rewrite: list[tuple[str, list[PackEntry]]] = []
    for pid, entries in by_pack.items():
        if pid not in packs_on_disk:
            continue
        live_entries = [e for e in entries if e.chunk_id in live and chosen[e.chunk_id][0] == pid]
        if not live_entries:
            continue
        staying = [e for e in live_entries if e.chunk_id not in to_rebase]
        dead_bytes = sum(e.length for e in entries) - sum(e.length for e in staying)
        if dead_bytes > REPACK_DEAD_FRACTION * packs_on_disk[pid]:
            rewrite.append((pid, live_entries))
            continue
        if staying:
            keep_packs[pid] = (packs_on_disk[pid], staying)
        if len(staying) < len(live_entries):   # only its chunks to rebase go to the new packs
            rewrite.append((pid, [e for e in live_entries if e.chunk_id in to_rebase]))
    return keep_packs, rewrite


def _doomed_packs(repo: Repository, delete_packs: list[str], by_pack: dict[str, list[PackEntry]],
                  now: float, grace_seconds: float) -> list[str]:
    """What the delete phase will remove: indexed packs no longer needed, and unindexed packs
    (a save that died before its index) once older than the grace period."""
    doomed: list[str] = []
    for pid in delete_packs:
        try:
            if pid not in by_pack and now - repo.store.mtime(pack_key(pid)) < grace_seconds:
                continue
        except FileNotFoundError:
            continue
        doomed.append(pid)
    return doomed
