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
from ..repo.layout import DEFAULT_GRACE_SECONDS
#: the newest versions deltification leaves as saved (``Repo.deltify(lag=...)``, ``deltackpt deltify --lag``)
from ..repo.layout import DEFAULT_DELTIFY_LAG as DEFAULT_DELTIFY_LAG
from ..repo.versions import Version
from ..store.base import Store
from .handles import Handle, opened, portable_location
from .loading import load, restore

# The write path and maintenance are imported by the methods that run them: a process that opens
# a Repo to load from it does not import them (bench/RESTART.md, "A restart's first load").
if TYPE_CHECKING:
    import torch

    from ..repo.maintain.drill import DrillReport
    from ..repo.maintain.gc import GcReport
    from ..repo.maintain.verify import VerifyReport
    from ..repo.write.deltify import DeltifyReport

    from ..repo.maintain.rebuild import RebuildReport
    from ..snapshot.handle import SaveHandle
    from ..snapshot.runtime import BackgroundOptions
    from ..torchstate.diff import TensorDiff
    from .types import (DeltaBase, Encoding, Metrics, Optimizers, RepoInfo, Revision, State, Stateful, TensorDetail,
                        Usage, VersionDetail, VersionUsage, Where)


class Repo(Handle):
    """A deltackpt repository handle: list, inspect, tag, check and maintain its versions, save and
    load through it; the owner of everything work on it starts and holds.

    A handle keeps the bytes its next save will delta against in memory (``delta_cache_bytes``)
    and runs background saves in a thread of its own.  :meth:`close` (or leaving the ``with``
    block) finishes the background saves, frees that memory and joins every thread and process
    the handle started: afterwards nothing of it runs or writes into the folder.  Two handles on
    one repository share nothing but the files.

    Args:
        location: a folder, an fsspec URL (``s3://bucket/run1``) or a store; another Repo opens a
            new handle on the same store.
        create: create the repository if it does not exist (a save creates it too).
        chunk_bytes: bytes per chunk for this handle's saves (the config's when None; 2 MiB in a new
            repository).
        keyframe_interval: store a chunk whole at least every N versions, bounding delta chains
            (the config's when None; 8 in a new repository).
        delta_cache_bytes: memory for the bytes the next save deltas against (only positions whose
            last change was a delta keep theirs; default a tenth of the state last saved); past it,
            or with 0, the base is read back from the repository when a delta needs it.
        level: zstd compression level of this handle's saves (default 1).
        delta_base: how versions chain, stored in the config by :meth:`init`: ``"child"`` (the
            default of format 2) writes each changed chunk once, whole or as a small forward delta,
            so ``resume`` reads about one object per chunk, and later re-stores older versions as
            deltas against newer chunks (:meth:`deltify`, and a bounded step after each save);
            ``"parent"`` chains every change forward (the smallest saves, the newest version the
            dearest to read); ``"keyframe"`` takes every lossless delta against its chunk's last
            keyframe.  bench/DELTAS.md compares them.
        background: how background saves run: ``"thread"``, ``"process"`` or a
            :class:`~deltackpt.snapshot.runtime.BackgroundOptions`.
        deltify: re-store older versions as reverse deltas after each save (default
            ``$DELTACKPT_DELTIFY``, on), where that pays back.
        payback: what "pays back" means: a rewrite must save at least this many stored bytes
            per byte it writes (default 1.0, ``deltackpt.repo.write.head.PAYBACK``).

    Raises:
        NotARepositoryError: the location holds no repository (and ``create`` is False).
        InvalidArgumentError: a setting out of range (``chunk_bytes``, ``keyframe_interval``,
            ``level``, ``delta_base``, ``background``).
        StoreError: the storage failed; the message names the path and the reason.

    Example:
        ```python
        with deltackpt.Repo("ckpt", create=True) as repo:
            v = repo.save({"model": model.state_dict(), "step": 10}, step=10)
            for version in repo.log():
                print(version.short_id, version.step, version.metrics)
            state = repo.load("latest~1", layers=["encoder"])
        ```
    """

    def __init__(self, location: "str | os.PathLike[str] | Store | Handle", *, create: bool = False,
                 chunk_bytes: int | None = None, keyframe_interval: int | None = None,
                 delta_cache_bytes: int | None = None, level: int | None = None,
                 delta_base: DeltaBase | None = None, background: "Where | BackgroundOptions | None" = None,
                 deltify: bool | None = None, payback: float | None = None) -> None:
        super().__init__(location, create=create, chunk_bytes=chunk_bytes, keyframe_interval=keyframe_interval,
                         delta_cache_bytes=delta_cache_bytes, level=level, delta_base=delta_base,
                         background=background, deltify=deltify, payback=payback)

    @classmethod
    def init(cls, location: "str | os.PathLike[str] | Store", *, chunk_bytes: int | None = None,
             keyframe_interval: int | None = None, delta_cache_bytes: int | None = None, level: int | None = None,
             delta_base: DeltaBase | None = None, background: "Where | BackgroundOptions | None" = None,
             deltify: bool | None = None, payback: float | None = None) -> "Repo":
        """Create an empty repository; one already there is opened as it is.

        Args:
            location: a folder, an fsspec URL or a store.
            chunk_bytes: bytes per chunk, stored in the new repository's config (default 2 MiB).
            keyframe_interval: store a chunk whole at least every N versions, stored in the config
                (default 8).
            delta_cache_bytes: as for :class:`Repo` (this handle only).
            level: as for :class:`Repo` (this handle only).
            delta_base: how versions chain (``"child"``, ``"parent"``, ``"keyframe"``; see
                :class:`Repo`), stored in the config.
            background: as for :class:`Repo` (this handle only).
            deltify: as for :class:`Repo` (this handle only).
            payback: as for :class:`Repo` (this handle only).

        Returns:
            The :class:`Repo` (close it, or use it in a ``with`` block).

        Example:
            ```python
            repo = deltackpt.Repo.init("ckpt", keyframe_interval=4)
            ```
        """
        return cls(location, create=True, chunk_bytes=chunk_bytes, keyframe_interval=keyframe_interval,
                   delta_cache_bytes=delta_cache_bytes, level=level, delta_base=delta_base, background=background,
                   deltify=deltify, payback=payback)

    def __enter__(self) -> "Repo":
        return self

    @property
    def location(self) -> str:
        """Where the repository is: its absolute folder, or its URL."""
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
        """The version a revision names.

        Args:
            version: an id or a 4+ digit prefix, a tag, ``latest``, ``latest~N``, ``best:METRIC[:min|:max]``.

        Returns:
            Its :class:`~deltackpt.Version`.

        Raises:
            UnknownVersionError: no version has that name; the message suggests the closest names
                (``did you mean 'latest'?``).
            AmbiguousVersionError: an id prefix that several versions start with.

        Example:
            ```python
            repo.resolve("latest~2").step
            ```
        """
        return self.core.version(self.core.resolve(version))

    def log(self, limit: int | None = None) -> list[Version]:
        """Every version, newest first.

        Args:
            limit: only the newest ``limit`` versions (the others' manifests are not decoded
                beyond their time).

        Returns:
            The :class:`~deltackpt.Version` of each.  A version whose manifest cannot be used is listed
            too, with ``error`` saying why (the others still are).

        Raises:
            InvalidArgumentError: ``limit`` is not a whole number of at least 0.

        Example:
            ```python
            [v.step for v in repo.log()]
            repo.log(limit=3)[0].id == repo.latest().id
            ```
        """
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise InvalidArgumentError(f"limit must be a whole number of at least 0, got {limit!r:.40}")
        tags = self.core.tags_by_version()
        return [Version.damaged(vid, str(v), tuple(sorted(tags.get(vid, [])))) if isinstance(v, DeltackptError)
                else v for vid, v in self.core.listing(limit)]

    def show(self, version: Revision = "latest", *, layers: "list[str] | str | None" = None) -> VersionDetail:
        """A version and its tensors: what ``deltackpt show`` prints.

        Args:
            version: which version.
            layers: list only the tensors under these module paths (as in :func:`deltackpt.load`).

        Returns:
            ``{"version": Version.to_json(), "exact": bool, "tensors": [...], "written": {...},
            "last_drill": {...} | None}``; each tensor has its ``name``, ``dtype``, ``shape``,
            ``logical_bytes``, ``stored_bytes`` (its chunks' stored objects), ``chunks``, ``encoding``,
            ``exact`` and ``max_abs_err``.

        Raises:
            UnknownVersionError: no such version.
            StateMismatchError: a layer that selects no tensor.

        Example:
            ```python
            repo.show("latest", layers=["encoder"])["tensors"][0]["stored_bytes"]
            ```
        """
        from ..repo.layers import selected_tensors

        vid = self.core.resolve(version)
        m = self.core.manifest(vid)
        self.core.index.refresh()
        tensors: list[TensorDetail] = []
        for t in (m.tensors[i] for i in selected_tensors(m, layers, f"version {vid[:10]}")):
            blob = m.blobs[t.blob]
            tensors.append({"name": t.name, "dtype": t.dtype, "shape": t.shape, "logical_bytes": t.nbytes,
                            "stored_bytes": self.core.index.stored_size(c.chunk_id for c in blob.chunks),
                            "chunks": len(blob.chunks), "encoding": t.encoding, "exact": t.exact,
                            "max_abs_err": t.max_abs_err, "shared_blob": blob.nbytes != t.nbytes})
        from ..repo.maintain import events
        drill = next((e.to_json() for e in events.usable(self.core, DRILL) if e.data.get("version") == vid), None)
        return {"version": self.core.version(vid).to_json(), "exact": m.exact, "tensors": tensors,
                "written": m.extra.get("written", {}), "last_drill": drill}

    def tag(self, name: str, version: Revision = "latest", *, force: bool = False) -> Version:
        """Name a version; gc keeps tagged versions.

        Args:
            name: the tag: letters, digits, ``.``, ``_``, ``-``; not ``latest`` or ``HEAD``, not
                starting with ``best``, not 4 or more hex digits.
            version: which version (default ``latest``).
            force: move the tag if it names another version.

        Returns:
            The :class:`~deltackpt.Version` tagged.

        Raises:
            InvalidNameError: a name that is not allowed.
            ConflictError: the tag names another version (and ``force`` is False).

        Example:
            ```python
            repo.tag("before-lr-change", "latest~3")
            ```
        """
        vid = self.core.resolve(version)
        from ..repo.write import commit
        commit.set_tag(self.core, name, vid, force=force)
        return self.core.version(vid)

    def untag(self, name: str) -> None:
        """Remove a tag; the version stays until gc removes it.

        Args:
            name: the tag.

        Raises:
            UnknownVersionError: no such tag.
        """
        from ..repo.write import commit
        commit.delete_tag(self.core, name)

    def tags(self) -> dict[str, str]:
        """Every tag and the version id it names: ``{"warmup-done": "3fa1...", ...}``."""
        return self.core.tags()

    def events(self) -> list[Event]:
        """The repository's event records (a guard's rollbacks, drills), newest first.

        Returns:
            The records; one that does not parse is listed as kind ``"damaged"``, with
            ``data["error"]`` saying why.

        Example:
            ```python
            [e.kind for e in repo.events()]
            ```
        """
        from ..repo.maintain import events
        return [e if isinstance(e, Event) else Event(eid, "damaged", math.nan, {"error": str(e)})
                for eid, e in events.scan(self.core)]

    def drill(self, version: Revision = "latest", *, threads: int | None = None,
              record: bool = True) -> DrillReport:
        """Restore a version into fresh memory as a restarted process would, check every chunk against
        its hash, measure the time and bytes read, and record it (``deltackpt log`` shows the last
        drill; ``YoungDaly`` uses the restore time).

        Args:
            version: which version (default ``latest``).
            threads: decode threads (default: every core).
            record: record the drill as an event.

        Returns:
            A ``DrillReport``: ``ok``, the time and bytes read, and what failed.  A version that does
            not restore gives ``ok`` False, not an error.

        Example:
            ```python
            report = repo.drill("latest~1"); assert report.ok
            ```
        """
        revision = version.id if isinstance(version, Version) else version
        from ..repo.maintain.drill import run_drill
        return run_drill(self.core, revision, threads=threads or os.cpu_count() or 1, record=record)

    def verify(self, *, read_data: bool = True) -> VerifyReport:
        """Re-read everything and check it: manifests, index, packs and every chunk's hash.

        Args:
            read_data: decode and hash every chunk (False: check the structure only).

        Returns:
            A :class:`~deltackpt.VerifyReport`: ``ok``, the problems found and every version each
            affects.

        Example:
            ```python
            assert repo.verify().ok
            ```
        """
        from ..repo.maintain.verify import run_verify
        with bar("verify", 1, unit_bytes=False) as update:
            return run_verify(self.core, read_data=read_data, progress=update)

    def rebuild_index(self) -> RebuildReport:
        """Re-derive the index from the pack headers, after verify reports a lost or damaged index file.

        Returns:
            A report of what was indexed (``packs_indexed``, ...).

        Example:
            ```python
            repo.rebuild_index().packs_indexed
            ```
        """
        from ..repo.maintain.rebuild import rebuild_index
        return rebuild_index(self.core)

    def du(self) -> Usage:
        """Disk use: what ``deltackpt du`` prints.

        Returns:
            ``{"versions": [...], "total": {...}}``: per version its ``logical_bytes`` (size in
            memory), ``written_bytes`` (what its save added), ``referenced_bytes`` (what a load of it
            reads) and ``unique_bytes`` (what no other version uses); in total the versions, their
            logical bytes and the stored bytes (packs and metadata).

        Example:
            ```python
            repo.du()["total"]["stored_bytes"]
            ```
        """

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
        """Tensor by tensor, how two versions differ.

        Args:
            a: the older version.
            b: the newer version (default ``latest``).

        Returns:
            One dict per tensor: ``name``, ``changed_fraction`` (of its elements), ``max_abs`` and
            ``rel_l2`` (of the difference), ``stored_bytes_a`` and ``stored_bytes_b``; a tensor only
            one version has has ``status`` ``added`` or ``removed``.

        Example:
            ```python
            repo.diff("latest~1", "latest")
            ```
        """

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
        from .saving import save
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

    def deltify(self, *, lag: int = DEFAULT_DELTIFY_LAG, max_bytes: int | None = None,
                payback: float | None = None) -> DeltifyReport:
        """Re-store what older versions hold whole as deltas against newer versions, now (a save
        does it after it commits, a bounded step; gc does it for what it keeps), where it pays back.

        Args:
            lag: the ``lag`` newest versions are left as saved (by default latest alone).
            max_bytes: past this many bytes of replaced copies, only the packs already begun are
                finished (None: no limit).
            payback: re-store a copy only where the stored bytes it saves are at least this many
                times the bytes it writes (default the handle's, 1.0: a dense fine-tune's
                keyframes, whose deltas would save a quarter, stay whole; sparse periods shrink
                many times over).

        Returns:
            A report: the ``chunks`` re-stored and the ``freed_bytes``, among others.

        Raises:
            InvalidArgumentError: ``lag`` below 1 or a negative ``max_bytes``.

        Example:
            ```python
            report = deltackpt.Repo("ckpt").deltify()
            print(report.chunks, report.freed_bytes)
            ```
        """
        if not is_int(lag) or lag < 1:
            raise InvalidArgumentError(f"lag must be an integer >= 1, got {lag!r:.80}")
        if max_bytes is not None and (not is_int(max_bytes) or max_bytes < 0):
            raise InvalidArgumentError(f"max_bytes must be None or an integer >= 0, got {max_bytes!r:.80}")
        from ..repo.write.deltify import deltify as run_deltify
        if payback is None:
            return run_deltify(self.session, lag=lag, max_bytes=max_bytes)
        from ..repo.write.session import check_payback
        saved, self.session.payback = self.session.payback, check_payback(payback)
        try:
            return run_deltify(self.session, lag=lag, max_bytes=max_bytes)
        finally:
            self.session.payback = saved


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
    """Remove the versions outside the retention rules, and the bytes only they held.

    The union of the rules is kept, and ``latest`` always.  A kept version never loses a delta
    base: its chunk is rewritten whole (``rebase=True``, reported as ``chunks_rebased``) or the base
    is kept (``bases_kept``).  What the kept versions older than the ``keep_last`` window still hold
    whole then becomes deltas against newer versions (``chunks_deltified``).

    Args:
        repo: the repository: a path or URL, a :class:`Repo` or a store.
        keep_last: keep ``latest`` and its N-1 first-parent ancestors.
        keep_tags: keep tagged versions (False: remove them and their tags too).
        dry_run: say what would go; take no lock, write nothing.
        keep_best: the best versions by a metric: ``"val_loss:2"`` (lower is better),
            ``"accuracy:3:max"`` or ``("val_loss", 2, "min")``.
        keep_every: keep one version every this many steps.
        keep_within: keep the versions saved in the last this many seconds.
        rebase: store kept chunks whose delta base is removed whole again (False: keep the base).
        grace_seconds: a pack no index names yet may belong to a save still running in another
            process, so gc deletes such files only once they are older than this.

    Returns:
        A :class:`~deltackpt.GcReport`: the versions ``removed`` and ``kept`` (with why), the
        ``reclaimed_bytes`` and what happened to the pack files.

    Raises:
        InvalidArgumentError: a rule out of range, or ``keep_best`` on a metric no version records
            (it would keep nothing); nothing is removed.
        RepositoryLockedError: another gc holds the repository, or a save outlasted gc's wait.

    Example:
        ```python
        report = deltackpt.gc("ckpt", keep_last=3, keep_best="val_loss:2", dry_run=True)
        print(report.removed, report.reclaimed_bytes)
        ```
    """
    from ..repo.maintain.gc import run_gc
    from ..repo.maintain.retention import Retention, check_metric_recorded, check_seconds
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
