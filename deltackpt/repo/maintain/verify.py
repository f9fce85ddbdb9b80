"""``verify``: re-read everything and check it, naming every version a bad object belongs to.

Checks everything ``load`` checks, for every version: config; every ref and tag parses and names
an existing manifest; every manifest's bytes hash to its id and pass the schema, and the index
backs each of its blobs with chunks of the lengths it declares (``blob_mismatch``, which load's
``check_blob`` runs too); every pack's bytes hash to its name and its header parses and agrees
with the index; every chunk any version needs (and each delta base) decodes to bytes that hash to
its id (``--quick``: its encoding id is known, nothing is decoded).  Leftover temp files,
unreferenced packs and damaged event records (rollbacks, drills) are warnings, not errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...codecs import registry
from ...errors import DeltackptError
from ...format import refs
from ..layout import EVENTS, LATEST_REF, MANIFESTS, PACKS, TAGS, pack_key
from ..read import packfile
from ..repository import Repository
from . import events


@dataclass
class Problem:
    object: str
    problem: str
    versions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"object": self.object, "problem": self.problem, "versions": self.versions}


@dataclass
class VerifyReport:
    """``ok`` is False when any committed version cannot be restored exactly."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    versions_checked: int = 0
    chunks_checked: int = 0
    packs_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def bad_versions(self) -> list[str]:
        return sorted({v for p in self.errors for v in p.versions})

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "errors": [p.to_json() for p in self.errors],
                "warnings": [p.to_json() for p in self.warnings], "bad_versions": self.bad_versions,
                "versions_checked": self.versions_checked, "chunks_checked": self.chunks_checked,
                "packs_checked": self.packs_checked}


def run_verify(repo: Repository, *, read_data: bool = True,
               progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    report = VerifyReport()
    repo.index.refresh()
    repo.chunks.decoded.clear()  # decode everything afresh
    manifests = _check_manifests(repo, report)
    _check_refs(repo, manifests, report)
    _check_blob_lengths(repo, manifests, report)
    users = _check_packs(repo, manifests, report)
    _check_index_files(repo, users, report)
    _check_chunks(repo, users, report, read_data=read_data, progress=progress)
    _warn_temp_files(repo, report)
    _check_events(repo, report)
    return report


def _check_manifests(repo: Repository, report: VerifyReport) -> dict:
    """Re-read every version's manifest from the store; return those that parse, by version id."""
    version_ids = repo.version_ids()
    manifests = {}
    for vid in version_ids:
        repo.forget_manifest(vid)
        try:
            manifests[vid] = repo.manifest(vid)
        except DeltackptError as exc:
            report.errors.append(Problem(MANIFESTS + vid, str(exc), [vid]))
    report.versions_checked = len(version_ids)
    return manifests


def _check_refs(repo: Repository, manifests: dict, report: VerifyReport) -> None:
    """Every ref and tag parses and names a version with a valid manifest."""
    ref_keys = [LATEST_REF] if repo.store.exists(LATEST_REF) else []
    ref_keys += repo.store.list(TAGS)
    for key in ref_keys:
        try:
            if key.startswith(TAGS):
                refs.check_name(key[len(TAGS):])
            vid = repo.read_ref(key)
            if vid is not None and vid not in manifests:
                report.errors.append(Problem(key, f"names version {vid[:10]}, which has no valid manifest", [vid]))
        except DeltackptError as exc:
            report.errors.append(Problem(key, str(exc)))


def _check_blob_lengths(repo: Repository, manifests: dict, report: VerifyReport) -> None:
    """The lengths load checks before it allocates (one function for both, so verify cannot pass
    a version load refuses)."""
    for vid, m in manifests.items():
        for b, blob in enumerate(m.blobs):
            why = repo.chunks.blob_mismatch(blob)
            if why is not None:
                report.errors.append(Problem(MANIFESTS + vid, f"blob {b}: {why}", [vid]))


def _check_packs(repo: Repository, manifests: dict, report: VerifyReport) -> dict[bytes, set[str]]:
    """Check every pack on disk or in the index; return which versions need which chunk (as of
    the index the pack check ended with)."""
    users = _users(repo, manifests)
    bad_packs: dict[str, str] = {}
    packs_on_disk = {k.rsplit("/", 1)[-1] for k in repo.store.list(PACKS)}
    indexed_packs = set(repo.index.pack_entries)
    for pid in sorted(packs_on_disk | indexed_packs):
        try:
            packfile.check(repo.store, pid)  # streamed: a pack is never held whole
        except FileNotFoundError:
            bad_packs[pid] = "pack file is missing"
            continue
        except DeltackptError as exc:
            bad_packs[pid] = str(exc)
        report.packs_checked += 1
        if pid not in indexed_packs:
            report.warnings.append(Problem(pack_key(pid), "no index refers to this pack (gc reclaims it)"))
    if any(why == "pack file is missing" for why in bad_packs.values()):
        # a save dropping the keyframes its reverse deltas replaced (or a gc) may have removed it
        # since we listed: only a pack the index still names is missing
        repo.index.refresh()
        indexed_packs = set(repo.index.pack_entries)
        bad_packs = {pid: why for pid, why in bad_packs.items() if pid in indexed_packs or why != "pack file is missing"}
        users = _users(repo, manifests)
    sound = lambda cid: any(p not in bad_packs and p in packs_on_disk for p, _ in repo.index.entries_for(cid))  # noqa: E731
    for pid, why in bad_packs.items():
        # a chunk also stored in a sound pack (a later save wrote it again) costs no version
        affected = sorted({v for cid, p, _ in repo.index.items(all_copies=True) if p == pid and not sound(cid)
                           for v in users.get(cid, ())})
        if affected or pid in indexed_packs:
            report.errors.append(Problem(pack_key(pid), why, affected))
        else:
            report.warnings.append(Problem(pack_key(pid), why))
    return users


def _check_index_files(repo: Repository, users: dict[bytes, set[str]], report: VerifyReport) -> None:
    """An unreadable index file costs every version that needs a chunk no readable index names."""
    unindexed = {v for cid, vs in users.items() if not repo.index.has_chunk(cid) for v in vs}
    for key, why in sorted(repo.index.bad_files.items()):
        report.errors.append(Problem(key, f"{why} (rebuild_index restores it from the packs)", sorted(unindexed)))


def _check_chunks(repo: Repository, users: dict[bytes, set[str]], report: VerifyReport, *,
                  read_data: bool, progress: Callable[[int, int], None] | None) -> None:
    """Every needed chunk is indexed and decodes to bytes that hash to its id (without
    ``read_data``: its encoding is one a codec owns)."""
    needed = sorted(users)
    for i, cid in enumerate(needed):
        if progress:
            progress(i, len(needed))
        if not repo.index.has_chunk(cid):
            report.errors.append(Problem(f"chunk {cid.hex()}", "not in the index", sorted(users[cid])))
            continue
        if not read_data:
            try:  # without decoding, still what load refuses first: an encoding no codec owns
                registry.get(repo.index.entry(cid)[1].encoding)
            except DeltackptError as exc:
                report.errors.append(Problem(f"chunk {cid.hex()}", str(exc), sorted(users[cid])))
            continue
        try:
            repo.chunks.read_chunk(cid)
            report.chunks_checked += 1
        except DeltackptError as exc:
            report.errors.append(Problem(f"chunk {cid.hex()}", str(exc), sorted(users[cid])))


def _warn_temp_files(repo: Repository, report: VerifyReport) -> None:
    temp_lister = getattr(repo.store, "temp_files", None)
    if temp_lister is not None:
        for key, _ in temp_lister():
            report.warnings.append(Problem(key, "leftover temp file of an interrupted write (gc removes it)"))


def _check_events(repo: Repository, report: VerifyReport) -> None:
    """A damaged event record costs no version: a warning naming it (gc leaves it for a person)."""
    for eid, e in events.scan(repo):
        if isinstance(e, DeltackptError):
            report.warnings.append(Problem(EVENTS + eid, f"event record does not parse: {e}"))


def _users(repo: Repository, manifests: dict) -> dict[bytes, set[str]]:
    """Which versions need which chunk, through the delta chains of the copies a reader reads."""
    users: dict[bytes, set[str]] = {}
    for vid, m in manifests.items():
        for blob in m.blobs:
            for c in blob.chunks:
                cur: bytes | None = c.chunk_id
                hops = 0
                while cur is not None and hops <= 1024:
                    s = users.setdefault(cur, set())
                    if vid in s:
                        break
                    s.add(vid)
                    cur = repo.index.entry(cur)[1].base if repo.index.has_chunk(cur) else None
                    hops += 1
    return users

