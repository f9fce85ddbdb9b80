"""The public API: save, load, restore, gc and Repo.  torch is imported only by the functions
that move tensors, so ``Repo(...).verify()``, ``log``, ``du`` and ``gc`` work without it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..errors import DeltackptError, InvalidArgumentError, UnsupportedLeafError
from ..progress import bar
from ..repo import commit, saver
from ..repo.gc import DEFAULT_GRACE_SECONDS, GcReport, run_gc
from ..repo.layout import DEFAULT_DELTA_CACHE_BYTES
from ..repo.repository import Repository
from ..repo.retention import Retention, check_seconds
from ..repo.verify import VerifyReport, run_verify
from ..repo.versions import Version
from ..store.base import Store

if TYPE_CHECKING:
    import torch

    from .async_save import SaveHandle

_OPEN: dict[str, Repository] = {}

from .restore import restore  # noqa: E402  (re-exported: deltackpt.restore)



def portable_location(repo: "str | os.PathLike | Store | Repo") -> "str | Store":
    """What reopens ``repo`` in another process (pickling, spawned ranks): an absolute path or a
    URL; a Store that is neither local nor fsspec is returned as it is (it pickles or it does not).

    ``portable_location("ckpt")`` -> ``"/abs/ckpt"``"""
    from ..store.fsspec_store import FsspecStore
    from ..store.local import LocalStore
    if isinstance(repo, Repo):
        repo = repo.core.store
    if type(repo) in (LocalStore, FsspecStore):
        return repo.describe()
    if isinstance(repo, Store):
        return repo
    text = os.fspath(repo)
    return text if "://" in text else os.path.abspath(text)


class Repo:
    """A deltackpt repository.

    Example::

        repo = deltackpt.Repo("ckpt")              # created on first save
        v = repo.save({"model": model.state_dict(), "step": 10}, step=10)
        for version in repo.log():
            print(version.short_id, version.step, version.metrics)
        state = repo.load("latest~1", layers=["encoder"])

    Opening the same path twice in a process shares one handle, so the delta cache (the last
    saved bytes, used to store the next version as deltas) survives ``deltackpt.save(obj, path)``
    calls.  ``delta_cache_bytes=0`` turns it off (every chunk that changed is then a keyframe).

    ``delta_base`` (stored in the config by ``Repo.init``) picks the topology: ``"child"`` (the
    default of format 2) stores the newest version whole and older ones as deltas against newer
    chunks, so ``resume`` reads one object per chunk; ``"parent"`` chains deltas forward (cheaper
    saves, the newest version the dearest to read); ``"keyframe"`` takes every lossless delta
    against its chunk's last keyframe.  bench/DELTAS.md compares them.
    """

    def __init__(self, location: "str | os.PathLike | Store | Repo", *, create: bool = False,
                 chunk_bytes: int | None = None, keyframe_interval: int | None = None,
                 delta_cache_bytes: int | None = None, level: int | None = None,
                 delta_base: str | None = None) -> None:
        if isinstance(location, Repo):
            self.core = location.core
            return
        if isinstance(location, Store):
            key = f"store@{id(location)}"  # two stores may describe themselves alike; identity is what counts
        else:
            text = os.fspath(location)
            key = text if "://" in text else os.path.abspath(text)
        core = _OPEN.get(key)
        if core is None or (create and not core.store.exists("config")):
            core = Repository(location, create=create, chunk_bytes=chunk_bytes, keyframe_interval=keyframe_interval,
                              delta_cache_bytes=DEFAULT_DELTA_CACHE_BYTES if delta_cache_bytes is None
                              else delta_cache_bytes, level=level or 1, delta_base=delta_base)
            _OPEN[key] = core
        else:
            if chunk_bytes:
                core.config.chunk_bytes = chunk_bytes
            if keyframe_interval is not None:
                core.config.keyframe_interval = keyframe_interval
            if delta_cache_bytes is not None:
                core.delta_cache.max_bytes = delta_cache_bytes
            if level is not None:
                core.level = level
            if delta_base is not None:
                from ..format.config import check_delta_base
                core.config.delta_base = check_delta_base(delta_base, core.config.version)
        self.core = core

    @classmethod
    def init(cls, location: "str | os.PathLike | Store", **kwargs: Any) -> "Repo":
        """Create an empty repository (no error if it exists).  ``Repo.init("ckpt")``"""
        return cls(location, create=True, **kwargs)

    def close(self) -> None:
        """Drop this process's handle and its delta cache."""
        from .async_save import on_repo_close
        for k, v in list(_OPEN.items()):
            if v is self.core:
                del _OPEN[k]
        self.core.delta_cache.clear()
        on_repo_close(self.core)

    @property
    def location(self) -> str:
        return self.core.location

    def __reduce__(self) -> tuple:
        # a Repo holds locks, caches and open files: another process reopens it from its location
        return (Repo, (portable_location(self),))

    def __repr__(self) -> str:
        return f"Repo({self.location!r})"

    # versions -------------------------------------------------------------------------------
    def resolve(self, version: "str | Version" = "latest") -> Version:
        """The Version a revision names: ``repo.resolve("latest~2")``."""
        return self.core.version(self.core.resolve(version))

    def log(self) -> list[Version]:
        """Every version, newest first: ``[v.step for v in repo.log()]``.  A version whose
        manifest cannot be used is listed too, with ``v.error`` saying why (the others still are)."""
        tags = self.core.tags_by_version()
        return [Version.damaged(vid, str(m), tuple(sorted(tags.get(vid, [])))) if isinstance(m, DeltackptError)
                else self.core.version(vid, tags, manifest=m) for vid, m in self.core.scan()]

    def show(self, version: "str | Version" = "latest") -> dict[str, Any]:
        """A version and its tensors (dtype, shape, logical and stored bytes, encoding, exactness).

        ``repo.show("latest")["tensors"][0]["stored_bytes"]``"""
        vid = self.core.resolve(version)
        m = self.core.manifest(vid)
        self.core.refresh_index()
        tensors = []
        for t in m.tensors:
            blob = m.blobs[t.blob]
            tensors.append({"name": t.name, "dtype": t.dtype, "shape": t.shape, "logical_bytes": t.nbytes,
                            "stored_bytes": self.core.stored_size(c.chunk_id for c in blob.chunks),
                            "chunks": len(blob.chunks), "encoding": t.encoding, "exact": t.exact,
                            "max_abs_err": t.max_abs_err, "shared_blob": blob.nbytes != t.nbytes})
        return {"version": self.core.version(vid).to_json(), "exact": m.exact, "tensors": tensors,
                "written": m.extra.get("written", {})}

    def tag(self, name: str, version: "str | Version" = "latest", *, force: bool = False) -> Version:
        """Name a version: ``repo.tag("best", "latest~3")``.  Tags are kept by gc."""
        vid = self.core.resolve(version)
        commit.set_tag(self.core, name, vid, force=force)
        return self.core.version(vid)

    def untag(self, name: str) -> None:
        """Remove a tag (the version stays until gc removes it)."""
        commit.delete_tag(self.core, name)

    def tags(self) -> dict[str, str]:
        return self.core.tags()

    def verify(self, *, read_data: bool = True) -> VerifyReport:
        """Re-read and re-hash everything: ``assert repo.verify().ok``."""
        with bar("verify", 1, unit_bytes=False) as update:
            return run_verify(self.core, read_data=read_data, progress=update)

    def rebuild_index(self) -> Any:
        """Re-derive the index from the pack headers (after verify reports a lost or damaged
        index file): ``repo.rebuild_index().packs_indexed``"""
        from ..repo.rebuild import rebuild_index
        return rebuild_index(self.core)

    def du(self) -> dict[str, Any]:
        """Logical and stored bytes per version and in total: ``repo.du()["total"]["stored_bytes"]``."""
        core = self.core
        core.refresh_index()
        refs_by_version: dict[str, set[bytes]] = {}
        counts: dict[bytes, int] = {}
        for vid in core.history():
            chunks = core.chunk_closure(c.chunk_id for b in core.manifest(vid).blobs for c in b.chunks)
            refs_by_version[vid] = chunks
            for c in chunks:
                counts[c] = counts.get(c, 0) + 1
        rows = []
        for vid, chunks in refs_by_version.items():
            v = core.version(vid)
            rows.append({"id": vid, "short_id": vid[:10], "step": v.step, "logical_bytes": v.logical_bytes,
                         "written_bytes": v.written_bytes,
                         "referenced_bytes": core.stored_size(chunks),
                         "unique_bytes": core.stored_size(c for c in chunks if counts[c] == 1)})
        packs = sum(core.store.size(k) for k in core.store.list("packs/"))
        meta = sum(core.store.size(k) for k in core.store.list("manifests/") + core.store.list("index/"))
        return {"versions": rows, "total": {"versions": len(rows),
                                            "logical_bytes": sum(r["logical_bytes"] for r in rows),
                                            "stored_bytes": packs + meta, "pack_bytes": packs,
                                            "metadata_bytes": meta}}

    def diff(self, a: "str | Version", b: "str | Version" = "latest") -> list[dict[str, Any]]:
        """Per tensor: fraction of elements changed, max abs and relative L2 difference, stored
        bytes in each version.  ``repo.diff("latest~1", "latest")``"""
        from .diff import diff_versions
        return diff_versions(self, a, b)

    # data -------------------------------------------------------------------------------------
    def save(self, obj: Any, **kwargs: Any) -> Version:
        """Same as :func:`deltackpt.save` with this repository."""
        return save(obj, self, **kwargs)

    def load(self, version: "str | Version" = "latest", **kwargs: Any) -> Any:
        """Same as :func:`deltackpt.load` with this repository."""
        return load(self, version, **kwargs)

    def restore(self, model: Any, version: "str | Version" = "latest", **kwargs: Any) -> Version:
        """Same as :func:`deltackpt.restore` with this repository."""
        return restore(model, self, version, **kwargs)

    def gc(self, **kwargs: Any) -> GcReport:
        """Same as :func:`deltackpt.gc` with this repository."""
        return gc(self, **kwargs)


def _repo(repo: "str | os.PathLike | Repo | Store", create: bool = False) -> Repo:
    if isinstance(repo, Repo):
        return repo
    return Repo(repo, create=create)


def save(obj: Any, repo: "str | os.PathLike | Repo | Store", *, step: int | None = None,
         metrics: Mapping[str, Any] | None = None, meta: Any = None, tag: str | None = None,
         encoding: Mapping[str, str] | str | None = None, blocking: bool = True,
         workers: int | None = None, background: str | None = None,
         optimizer: Any = None) -> "Version | SaveHandle":
    """Save a module's state_dict, a state dict or a nested training state as a new version.

    Unchanged chunks are not written again; changed ones are stored as deltas against the last
    version this process saved, when that is smaller.  ``encoding`` opts tensors into lossy modes
    by name pattern (``{"optimizer.*": "q8-delta"}``); the default is lossless.

    ``blocking=False`` returns a :class:`~deltackpt.frontend.async_save.SaveHandle` as soon as
    the tensors are copied to host memory; the rest runs in the background
    (``handle.wait()`` returns the Version).  Any save first waits for a background save to the
    same repository still in flight, and raises its error if nobody has waited for it.

    ``background``: where a background save runs, ``"thread"`` or ``"process"`` (a persistent
    encoder process fed through shared memory: the save's Python then never takes the training
    loop's GIL; local repositories and CPU tensors only, others use the thread).  Default:
    ``deltackpt.frontend.async_save.BACKGROUND`` (``"thread"``).

    ``optimizer`` (with ``blocking=False``; one optimizer or a list): a *lazy* snapshot.  The
    tensors the optimizer owns (its parameters and every tensor in ``optimizer.state``, found by
    storage) are copied in the background while the next forward and backward run, and a step
    pre-hook makes ``optimizer.step()`` wait for that copy before it writes; every other tensor is
    copied at call time.  Any other in-place write to a parameter or optimizer-state tensor before
    the next ``optimizer.step()`` (``model.load_state_dict``, EMA weights swapped in, ``p.mul_()``
    under ``no_grad``) is the user's to declare by calling ``handle.wait_snapshot()`` first; what
    is safe without it is listed in :mod:`deltackpt.frontend.lazy`.  ``handle.step_wait_seconds``
    tells how long steps waited.  With ``blocking=True`` the save is complete when it returns and
    ``optimizer`` is not needed (it is checked, then ignored).

    ``workers``: encoder threads.  By default a blocking save uses every core (up to 4) and a
    background save the cores the training loop leaves free (``os.cpu_count()`` minus
    ``torch.get_num_threads()``, at least 1), so that it does not compete with training for CPU.
    On Linux a background save's threads also run under ``SCHED_IDLE``, so they never preempt the
    training loop, and return to normal priority once anyone waits for the save
    (:mod:`deltackpt.frontend.priority`; ``async_save.BACKGROUND_IDLE = False`` turns it off).

    Example::

        v = deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 100},
                           "ckpt", step=100, metrics={"loss": 0.31}, tag="warmup-done")
        h = deltackpt.save(model, "ckpt", step=200, blocking=False)   # training goes on
        h.wait()
        h = deltackpt.save(training_state(model=model, optimizer=opt), "ckpt", step=300,
                           blocking=False, optimizer=opt)        # returns before copying the weights
    """
    import torch

    from . import async_save
    from ..format.refs import check_name
    from .dtypes import name_of
    from .flatten import INT_MAX, INT_MIN, flatten, int_text, metrics_of, plain_only
    from .planner import plan_blobs

    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    tree, leaves = flatten(obj)
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise UnsupportedLeafError(f"step must be an int, got {type(step).__name__}")
    if step is not None and not INT_MIN <= step <= INT_MAX:
        raise UnsupportedLeafError(f"step {int_text(step)} does not fit in 64 bits")
    plain_metrics, plain_meta = metrics_of(metrics), plain_only(meta, "meta")
    if background not in (None, "thread", "process"):
        raise DeltackptError(f"background must be 'thread' or 'process', got {background!r}")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise DeltackptError(f"workers must be a positive int (encoder threads), got {workers!r}")
    # everything that can refuse the input does so before a repository is created or touched
    plan_blobs([], encoding)
    for leaf in leaves:
        name_of(leaf.tensor.dtype, leaf.name)
    if tag is not None:
        check_name(tag)
    optimizers = None
    if optimizer is not None:
        from .lazy import optimizers_of
        optimizers = optimizers_of(optimizer)
    r = _repo(repo, create=True)

    def write(leaves: list, tree: Any, devices: list[str] | None = None, threads: int | None = workers,
              encoder: Any = None, segment: Any = None, owner: Any = None) -> Version:
        blobs, entries = plan_blobs(leaves, encoding)
        for b in blobs:   # background saves lend their staging copy to the delta cache
            b.owner = owner
        if devices is not None:  # staged copies live on the CPU; record where the tensors lived
            for e, device in zip(entries, devices):
                e.device = device
        kwargs = dict(step=step, metrics=plain_metrics, meta=plain_meta, tag=tag, workers=threads)
        if encoder is not None:
            vid, stats = encoder.write_version(r.core, blobs, entries, tree, segment=segment, **kwargs)
        else:
            total = sum(len(b.data) for b in blobs)
            with bar("save", total if devices is None else 0) as update:
                vid, stats = saver.write_version(r.core, blobs, entries, tree, progress=update, **kwargs)
        return r.core.version(vid, manifest=stats.manifest)

    if not blocking:
        devices = [str(leaf.tensor.device) for leaf in leaves]
        threads = workers or async_save.spare_cores()
        return async_save.submit(r, leaves, tree, lambda staged, t, **where: write(staged, t, devices, threads, **where),
                                 background=background, optimizers=optimizers)
    async_save.drain(r.core)
    return write(leaves, tree)


def load(repo: "str | os.PathLike | Repo | Store", version: "str | Version" = "latest", *,
         layers: Iterable[str] | str | None = None, map_location: "str | torch.device | None" = "cpu",
         return_version: bool = False, threads: int | None = None) -> Any:
    """Load a version: the saved structure with bit-identical tensors.

    ``layers=["encoder"]`` returns only tensors under that module path and reads only their
    chunks.  ``return_version=True`` returns ``(state, Version)``; ``Version.exact`` says whether
    any tensor was stored lossily.  ``threads``: decode threads (default
    ``$DELTACKPT_READ_THREADS``, else every core).

    Example::

        state = deltackpt.load("ckpt", "latest~2")
        model.load_state_dict(state["model"])
    """
    from .flatten import unflatten
    from .materialize import build_tensors, read_blobs, read_threads
    from .planner import selected_tensors

    if threads is not None:
        read_threads(threads)  # refused before anything is read
    r = _repo(repo)
    vid = r.core.resolve(version)
    m = r.core.manifest(vid)
    r.core.refresh_index()
    chosen = selected_tensors(m, layers)
    with bar("load", sum(m.blobs[b].nbytes for b in {m.tensors[i].blob for i in chosen})):
        buffers = read_blobs(r.core, vid, m, (m.tensors[i].blob for i in chosen), threads=threads)
    tensors = build_tensors(m, chosen, buffers, map_location)
    keep = None if layers is None else set(chosen).__contains__
    state = unflatten(m.tree, tensors.__getitem__, keep)
    return (state, r.core.version(vid)) if return_version else state


def gc(repo: "str | os.PathLike | Repo | Store", *, keep_last: int | None = None, keep_tags: bool = True,
       dry_run: bool = False, keep_best: "tuple[str, int, str] | str | None" = None, keep_every: int | None = None,
       keep_within: float | None = None, rebase: bool = True,
       grace_seconds: float = DEFAULT_GRACE_SECONDS) -> GcReport:
    """Remove versions outside the retention rules, and the bytes only they held.

    The union of the rules is kept, and ``latest`` always.  A kept version never loses a delta
    base: its chunk is rewritten as a keyframe (``rebase=True``, reported as ``chunks_rebased``)
    or the base is kept (``bases_kept``).

    Example::

        report = deltackpt.gc("ckpt", keep_last=3, keep_best="val_loss:2", dry_run=True)
        print(report.removed, report.reclaimed_bytes)
    """
    policy = Retention(keep_last=keep_last, keep_best=keep_best, keep_every=keep_every,
                       keep_within=keep_within, keep_tags=keep_tags)
    # NaN would compare as "older than the grace period" and delete a pack another writer is
    # still to commit; an infinite grace period keeps every unreferenced pack, which is safe
    grace_seconds = check_seconds("grace_seconds", grace_seconds, allow_inf=True)
    for name, flag in (("dry_run", dry_run), ("rebase", rebase)):
        if not isinstance(flag, bool):
            raise InvalidArgumentError(f"{name} must be True or False, got {flag!r:.80}")
    return run_gc(_repo(repo).core, policy, dry_run=dry_run, rebase=rebase, grace_seconds=grace_seconds)
