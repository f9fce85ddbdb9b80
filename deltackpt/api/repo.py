"""``deltackpt.Repo``, the handle on one repository, and ``deltackpt.gc``.  torch is imported only
by the methods that move tensors, so ``Repo(...).verify()``, ``log``, ``du`` and ``gc`` work
without it."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Iterable, Literal, cast, overload

from ..errors import DeltackptError, InvalidArgumentError
from ..progress import bar
from ..codecs.base import is_int
from ..format.events import DRILL, Event
from ..repo.maintain import events
from ..repo.write import commit
from ..repo.write.deltify import DEFAULT_LAG, DeltifyReport

#: the newest versions deltification leaves as saved (``Repo.deltify(lag=...)``, ``deltackpt deltify --lag``)
DEFAULT_DELTIFY_LAG = DEFAULT_LAG
from ..repo.write.deltify import deltify as run_deltify
from ..repo.maintain.drill import DrillReport, run_drill
from ..repo.maintain.gc import DEFAULT_GRACE_SECONDS, GcReport, run_gc
from ..repo.maintain.retention import Retention, check_metric_recorded, check_seconds
from ..repo.maintain.verify import VerifyReport, run_verify
from ..repo.versions import Version
from ..store.base import Store
from .handles import Handle, opened, portable_location
from .loading import load, restore
from .saving import save

if TYPE_CHECKING:
    import torch

    from ..repo.maintain.rebuild import RebuildReport
    from ..snapshot.handle import SaveHandle
    from ..snapshot.runtime import BackgroundOptions
    from ..torchstate.diff import TensorDiff
    from .types import (DeltaBase, Encoding, Metrics, Optimizers, RepoInfo, Revision, State, Stateful, TensorDetail,
                        Usage, VersionDetail, VersionUsage, Where)


class Repo(Handle):
    """A deltackpt repository handle: the owner of everything work on it starts and holds.

    Example::

        with deltackpt.Repo("ckpt", create=True) as repo:
            v = repo.save({"model": model.state_dict(), "step": 10}, step=10)
            for version in repo.log():
                print(version.short_id, version.step, version.metrics)
            state = repo.load("latest~1", layers=["encoder"])

    A handle keeps the last saved bytes in memory (``delta_cache_bytes``; 0 turns it off) as the
    bases the next save stores its deltas against, and runs background saves in a thread of its
    own (``background``: ``"thread"``, ``"process"`` or a
    :class:`~deltackpt.snapshot.runtime.BackgroundOptions`).  :meth:`close` (or leaving the
    ``with`` block) finishes the background saves, frees that memory and joins every thread and
    process the handle started: afterwards nothing of it runs or writes into the folder.  Two
    handles on one repository share nothing but the files.

    ``delta_base`` (stored in the config by ``Repo.init``) picks the topology: ``"child"`` (the
    default of format 2) writes each changed chunk once, whole or as a small forward delta, so
    ``resume`` reads about one object per chunk, and later re-stores older versions as deltas
    against newer chunks (:meth:`deltify`, and a bounded step after each save unless
    ``deltify=False``); ``"parent"`` chains every change forward (the smallest saves, the newest
    version the dearest to read); ``"keyframe"`` takes every lossless delta against its chunk's
    last keyframe.  bench/DELTAS.md compares them.
    """

    def __init__(self, location: "str | os.PathLike[str] | Store | Handle", *, create: bool = False,
                 chunk_bytes: int | None = None, keyframe_interval: int | None = None,
                 delta_cache_bytes: int | None = None, level: int | None = None,
                 delta_base: DeltaBase | None = None, background: "Where | BackgroundOptions | None" = None,
                 deltify: bool | None = None) -> None:
        super().__init__(location, create=create, chunk_bytes=chunk_bytes, keyframe_interval=keyframe_interval,
                         delta_cache_bytes=delta_cache_bytes, level=level, delta_base=delta_base,
                         background=background, deltify=deltify)

    @classmethod
    def init(cls, location: "str | os.PathLike[str] | Store", *, chunk_bytes: int | None = None,
             keyframe_interval: int | None = None, delta_cache_bytes: int | None = None, level: int | None = None,
             delta_base: DeltaBase | None = None, background: "Where | BackgroundOptions | None" = None,
             deltify: bool | None = None) -> "Repo":
        """Create an empty repository (no error if it exists).  ``Repo.init("ckpt")``"""
        return cls(location, create=True, chunk_bytes=chunk_bytes, keyframe_interval=keyframe_interval,
                   delta_cache_bytes=delta_cache_bytes, level=level, delta_base=delta_base, background=background,
                   deltify=deltify)

    def __enter__(self) -> "Repo":
        return self

    @property
    def location(self) -> str:
        return self.core.location

    def __reduce__(self) -> "tuple[type[Repo], tuple[str | Store]]":
        # a Repo holds locks, caches and open files: another process reopens it from its location
        return (Repo, (portable_location(self),))

    def __repr__(self) -> str:
        return f"Repo({self.location!r})"

    def info(self) -> RepoInfo:
        """The repository's location and the settings its config holds (format version, id, chunk
        size, keyframe interval, delta topology): ``repo.info()["chunk_bytes"]``."""
        c = self.core.config
        return {"location": self.core.location, "format_version": c.version, "repo_id": c.repo_id,
                "chunk_bytes": c.chunk_bytes, "keyframe_interval": c.keyframe_interval, "delta_base": c.delta_base}

    # versions -------------------------------------------------------------------------------
    def latest(self) -> Version | None:
        """The newest version of the training line (what ``latest`` names), None while there is
        none: ``v = repo.latest(); print(v.step if v else "empty")``."""
        vid = self.core.latest()
        return None if vid is None else self.core.version(vid)

    def resolve(self, version: Revision = "latest") -> Version:
        """The Version a revision names: ``repo.resolve("latest~2")``."""
        return self.core.version(self.core.resolve(version))

    def log(self) -> list[Version]:
        """Every version, newest first: ``[v.step for v in repo.log()]``.  A version whose
        manifest cannot be used is listed too, with ``v.error`` saying why (the others still are)."""
        tags = self.core.tags_by_version()
        return [Version.damaged(vid, str(m), tuple(sorted(tags.get(vid, [])))) if isinstance(m, DeltackptError)
                else self.core.version(vid, tags, manifest=m) for vid, m in self.core.scan()]

    def show(self, version: Revision = "latest") -> VersionDetail:
        """A version and its tensors (dtype, shape, logical and stored bytes, encoding, exactness).

        ``repo.show("latest")["tensors"][0]["stored_bytes"]``"""
        vid = self.core.resolve(version)
        m = self.core.manifest(vid)
        self.core.index.refresh()
        tensors: list[TensorDetail] = []
        for t in m.tensors:
            blob = m.blobs[t.blob]
            tensors.append({"name": t.name, "dtype": t.dtype, "shape": t.shape, "logical_bytes": t.nbytes,
                            "stored_bytes": self.core.index.stored_size(c.chunk_id for c in blob.chunks),
                            "chunks": len(blob.chunks), "encoding": t.encoding, "exact": t.exact,
                            "max_abs_err": t.max_abs_err, "shared_blob": blob.nbytes != t.nbytes})
        drill = next((e.to_json() for e in events.usable(self.core, DRILL) if e.data.get("version") == vid), None)
        return {"version": self.core.version(vid).to_json(), "exact": m.exact, "tensors": tensors,
                "written": m.extra.get("written", {}), "last_drill": drill}

    def tag(self, name: str, version: Revision = "latest", *, force: bool = False) -> Version:
        """Name a version: ``repo.tag("best", "latest~3")``.  Tags are kept by gc."""
        vid = self.core.resolve(version)
        commit.set_tag(self.core, name, vid, force=force)
        return self.core.version(vid)

    def untag(self, name: str) -> None:
        """Remove a tag (the version stays until gc removes it)."""
        commit.delete_tag(self.core, name)

    def tags(self) -> dict[str, str]:
        return self.core.tags()

    def events(self) -> list[Event]:
        """The repository's event records (a guard's rollbacks, drills), newest first; a record
        that does not parse is listed as kind ``"damaged"`` with ``data["error"]`` saying why.

        ``[e.kind for e in repo.events()]``"""
        return [e if isinstance(e, Event) else Event(eid, "damaged", math.nan, {"error": str(e)})
                for eid, e in events.scan(self.core)]

    def drill(self, version: Revision = "latest", *, threads: int | None = None,
              record: bool = True) -> DrillReport:
        """Restore ``version`` into fresh memory as a restarted process would, check every chunk
        against its hash, measure the time and bytes read, and record it (``deltackpt log`` shows
        the last drill; ``YoungDaly`` uses the restore time).  ``threads``: decode threads
        (default: every core).  A version that does not restore gives ``ok`` False, not an error.

        ``report = repo.drill("latest~1"); assert report.ok``"""
        revision = version.id if isinstance(version, Version) else version
        return run_drill(self.core, revision, threads=threads or os.cpu_count() or 1, record=record)

    def verify(self, *, read_data: bool = True) -> VerifyReport:
        """Re-read and re-hash everything: ``assert repo.verify().ok``."""
        with bar("verify", 1, unit_bytes=False) as update:
            return run_verify(self.core, read_data=read_data, progress=update)

    def rebuild_index(self) -> RebuildReport:
        """Re-derive the index from the pack headers (after verify reports a lost or damaged
        index file): ``repo.rebuild_index().packs_indexed``"""
        from ..repo.maintain.rebuild import rebuild_index
        return rebuild_index(self.core)

    def du(self) -> Usage:
        """Logical and stored bytes per version and in total: ``repo.du()["total"]["stored_bytes"]``."""
        core = self.core
        core.index.refresh()
        refs_by_version: dict[str, set[bytes]] = {}
        counts: dict[bytes, int] = {}
        for vid in core.history():
            chunks = core.index.chunk_closure(c.chunk_id for b in core.manifest(vid).blobs for c in b.chunks)
            refs_by_version[vid] = chunks
            for c in chunks:
                counts[c] = counts.get(c, 0) + 1
        rows: list[VersionUsage] = []
        for vid, chunks in refs_by_version.items():
            v = core.version(vid)
            rows.append({"id": vid, "short_id": vid[:10], "step": v.step, "logical_bytes": v.logical_bytes,
                         "written_bytes": v.written_bytes,
                         "referenced_bytes": core.index.stored_size(chunks),
                         "unique_bytes": core.index.stored_size(c for c in chunks if counts[c] == 1)})
        packs = sum(core.store.size(k) for k in core.store.list("packs/"))
        meta = sum(core.store.size(k) for k in core.store.list("manifests/") + core.store.list("index/"))
        return {"versions": rows, "total": {"versions": len(rows),
                                            "logical_bytes": sum(r["logical_bytes"] for r in rows),
                                            "stored_bytes": packs + meta, "pack_bytes": packs,
                                            "metadata_bytes": meta}}

    def diff(self, a: Revision, b: Revision = "latest") -> list[TensorDiff]:
        """Per tensor: fraction of elements changed, max abs and relative L2 difference, stored
        bytes in each version.  ``repo.diff("latest~1", "latest")``"""
        from ..torchstate.diff import diff_versions
        return diff_versions(self, a, b)

    # data -------------------------------------------------------------------------------------
    # the same parameters as the functions (tests/test_typing.py checks they stay so)
    @overload
    def save(self, obj: State, *, step: int | None = None, metrics: Metrics | None = None, meta: object = None,
             tag: str | None = None, encoding: Encoding | None = None, blocking: Literal[True] = True,
             workers: int | None = None, background: Where | None = None, optimizer: Optimizers | None = None,
             latest: bool = True) -> Version: ...

    @overload
    def save(self, obj: State, *, step: int | None = None, metrics: Metrics | None = None, meta: object = None,
             tag: str | None = None, encoding: Encoding | None = None, blocking: Literal[False],
             workers: int | None = None, background: Where | None = None, optimizer: Optimizers | None = None,
             latest: bool = True) -> SaveHandle: ...

    @overload
    def save(self, obj: State, *, step: int | None = None, metrics: Metrics | None = None, meta: object = None,
             tag: str | None = None, encoding: Encoding | None = None, blocking: bool,
             workers: int | None = None, background: Where | None = None, optimizer: Optimizers | None = None,
             latest: bool = True) -> "Version | SaveHandle": ...

    def save(self, obj: State, *, step: int | None = None, metrics: Metrics | None = None, meta: object = None,
             tag: str | None = None, encoding: Encoding | None = None, blocking: bool = True,
             workers: int | None = None, background: Where | None = None, optimizer: Optimizers | None = None,
             latest: bool = True) -> "Version | SaveHandle":
        """Same as :func:`deltackpt.save` with this repository."""
        return save(obj, self, step=step, metrics=metrics, meta=meta, tag=tag, encoding=encoding, blocking=blocking,
                    workers=workers, background=background, optimizer=optimizer, latest=latest)

    @overload
    def load(self, version: Revision = "latest", *, layers: Iterable[str] | str | None = None,
             map_location: "str | torch.device | None" = "cpu", return_version: Literal[False] = False,
             threads: int | None = None) -> Any: ...

    @overload
    def load(self, version: Revision = "latest", *, layers: Iterable[str] | str | None = None,
             map_location: "str | torch.device | None" = "cpu", return_version: Literal[True],
             threads: int | None = None) -> tuple[Any, Version]: ...

    @overload
    def load(self, version: Revision = "latest", *, layers: Iterable[str] | str | None = None,
             map_location: "str | torch.device | None" = "cpu", return_version: bool,
             threads: int | None = None) -> Any: ...

    def load(self, version: Revision = "latest", *, layers: Iterable[str] | str | None = None,
             map_location: "str | torch.device | None" = "cpu", return_version: bool = False,
             threads: int | None = None) -> Any:
        """Same as :func:`deltackpt.load` with this repository."""
        return load(self, version, layers=layers, map_location=map_location, return_version=return_version,
                    threads=threads)

    def restore(self, model: "torch.nn.Module", version: Revision = "latest", *,
                layers: Iterable[str] | str | None = None, optimizer: "Stateful | None" = None,
                strict: bool = True, threads: int | None = None) -> Version:
        """Same as :func:`deltackpt.restore` with this repository."""
        return restore(model, self, version, layers=layers, optimizer=optimizer, strict=strict, threads=threads)

    def gc(self, *, keep_last: int | None = None, keep_tags: bool = True, dry_run: bool = False,
           keep_best: "tuple[str, int, str] | str | None" = None, keep_every: int | None = None,
           keep_within: float | None = None, rebase: bool = True,
           grace_seconds: float = DEFAULT_GRACE_SECONDS) -> GcReport:
        """Same as :func:`deltackpt.gc` with this repository."""
        return gc(self, keep_last=keep_last, keep_tags=keep_tags, dry_run=dry_run, keep_best=keep_best,
                  keep_every=keep_every, keep_within=keep_within, rebase=rebase, grace_seconds=grace_seconds)

    def deltify(self, *, lag: int = DEFAULT_LAG, max_bytes: int | None = None) -> DeltifyReport:
        """Re-store what older versions hold whole as deltas against newer versions, now (saves do
        it in the background, a bounded step at a time; gc does it for what it keeps).  The ``lag``
        newest versions are left as saved (by default latest alone); past ``max_bytes`` of
        replaced copies only the packs already begun are finished.

        Example::

            report = deltackpt.Repo("ckpt").deltify()
            print(report.chunks, report.freed_bytes)
        """
        if not is_int(lag) or lag < 1:
            raise InvalidArgumentError(f"lag must be an integer >= 1, got {lag!r:.80}")
        if max_bytes is not None and (not is_int(max_bytes) or max_bytes < 0):
            raise InvalidArgumentError(f"max_bytes must be None or an integer >= 0, got {max_bytes!r:.80}")
        return run_deltify(self.session, lag=lag, max_bytes=max_bytes)


def open_repo(repo: "str | os.PathLike[str] | Repo | Store", create: bool = False) -> Repo:
    """``repo`` itself when it is a Repo, else a new Repo on that location, which the caller owns
    (and closes): ``with open_repo("ckpt") as r: r.log()``."""
    if isinstance(repo, Repo):
        return repo
    return Repo(repo, create=create)


def gc(repo: "str | os.PathLike[str] | Repo | Store", *, keep_last: int | None = None, keep_tags: bool = True,
       dry_run: bool = False, keep_best: "tuple[str, int, str] | str | None" = None, keep_every: int | None = None,
       keep_within: float | None = None, rebase: bool = True,
       grace_seconds: float = DEFAULT_GRACE_SECONDS) -> GcReport:
    """Remove versions outside the retention rules, and the bytes only they held.

    The union of the rules is kept, and ``latest`` always.  ``keep_best`` on a metric no version
    records is refused (InvalidArgumentError, nothing removed): it would keep nothing.  A kept
    version never loses a delta base: its chunk is rewritten as a keyframe (``rebase=True``,
    reported as ``chunks_rebased``) or the base is kept (``bases_kept``).  What the kept versions
    older than the ``keep_last`` window still hold whole then becomes deltas against newer
    versions (``chunks_deltified``).

    Example::

        report = deltackpt.gc("ckpt", keep_last=3, keep_best="val_loss:2", dry_run=True)
        print(report.removed, report.reclaimed_bytes)
    """
    # Retention parses the "METRIC:COUNT[:min|max]" form too (after checking the other rules); its
    # field's type is the parsed tuple
    policy = Retention(keep_last=keep_last, keep_best=cast("tuple[str, int, str] | None", keep_best), keep_every=keep_every,
                       keep_within=keep_within, keep_tags=keep_tags)
    # NaN would compare as "older than the grace period" and delete a pack another writer is
    # still to commit; an infinite grace period keeps every unreferenced pack, which is safe
    grace_seconds = check_seconds("grace_seconds", grace_seconds, allow_inf=True)
    for name, flag in (("dry_run", dry_run), ("rebase", rebase)):
        if not isinstance(flag, bool):
            raise InvalidArgumentError(f"{name} must be True or False, got {flag!r:.80}")
    with opened(repo) as handle:
        if policy.keep_best is not None:
            check_metric_recorded(handle.core, policy.keep_best[0])
        return run_gc(handle.session, policy, dry_run=dry_run, rebase=rebase, grace_seconds=grace_seconds)
