"""The one internal API that :mod:`deltackpt.training` and :mod:`deltackpt.integrations` use
beyond deltackpt's public names.

Those packages stand on :mod:`deltackpt.api`: they never reach into a handle's ``core`` or import
``deltackpt.repo``, ``deltackpt.snapshot`` or ``deltackpt.store`` (import-linter forbids it, and a
test forbids ``.core`` there).  What they need that the public :class:`~deltackpt.Repo` does not
offer is here, as functions of a Repo, so that the repository's internals can change behind it.
Not public: names and signatures may change between releases.

Example::

    from deltackpt.api import internal
    for vid, err in internal.newest_first(repo):
        print(vid, err or internal.head(repo, vid).step)
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..errors import DeltackptError
from ..format.events import Event
from ..format.manifest import Blob, Manifest, ManifestSummary, TensorEntry, TensorRef
from ..repo import locks
from ..repo.maintain import events as _events
from ..repo.maintain.drill import DrillReport, run_drill
from ..repo.maintain.gc import DEFAULT_GRACE_SECONDS, GcReport, run_gc
from ..repo.maintain.holds import MAX_HELD, Hold
from ..repo.maintain.retention import Retention, check_seconds
from ..repo.repository import ManifestHead
from ..repo.versions import Version
from ..repo.write import saver
from ..repo.write.saver import BlobInput, SaveStats
from ..snapshot.handle import SaveHandle
from ..store.base import Store
from ..store.counting import ReadMeter
from .handles import Handle

if TYPE_CHECKING:
    import numpy as np

    from ..torchstate.flatten import TensorLeaf

__all__ = ["Blob", "BlobInput", "DEFAULT_GRACE_SECONDS", "DrillReport", "Event", "GcReport", "Hold", "MAX_HELD",
           "Manifest", "ManifestSummary", "ReadMeter", "Retention", "SaveHandle", "SaveStats", "Store", "TensorEntry", "TensorRef", "Version",
           "abandoned_versions", "check_seconds", "collect", "commit_manifest", "drill", "events_of", "head", "hold",
           "latest_id", "manifest", "metered", "newest_first", "prepare_staging", "read_blobs", "read_chunk", "record_event", "refresh_index",
           "resolve_id", "run_after", "save_lease", "set_deltify_lag", "summary", "stamp", "store", "store_blobs",
           "unhook_finished_snapshots", "version_ids", "version_of", "wait_snapshots"]


# versions ------------------------------------------------------------------------------------------

def newest_first(repo: Handle) -> "list[tuple[str, DeltackptError | None]]":
    """Every version id newest first by its manifest's head, with the error of one whose head
    does not decode (Repository.newest_first)."""
    return repo.core.newest_first()


def head(repo: Handle, vid: str) -> "ManifestHead":
    """Version ``vid``'s manifest's time, parent, step and metrics (Repository.head)."""
    return repo.core.head(vid)


def summary(repo: Handle, vid: str) -> "ManifestSummary":
    """Version ``vid``'s manifest summarized, its tensors and blobs not built (decode_summary)."""
    return repo.core.summary(vid)


def manifest(repo: Handle, vid: str) -> Manifest:
    return repo.core.manifest(vid)


def latest_id(repo: Handle) -> str | None:
    """The version ``latest`` names, None in an empty repository."""
    return repo.core.latest()


def resolve_id(repo: Handle, revision: "str | Version") -> str:
    """The full id a revision names (``latest~1``, a tag, ``best:loss``, an id prefix)."""
    return repo.core.resolve(revision)


def version_ids(repo: Handle) -> list[str]:
    return repo.core.version_ids()


def version_of(repo: Handle, vid: str, m: Manifest | None = None) -> Version:
    return repo.core.version(vid, manifest=m)


# reading -------------------------------------------------------------------------------------------

def read_blobs(repo: Handle, vid: str, m: Manifest, blobs: Iterable[int],
               seeds: "dict[int, np.ndarray] | None" = None) -> "dict[int, np.ndarray]":
    """:func:`deltackpt.torchstate.materialize.read_blobs` on this handle's repository (the index
    refreshed first)."""
    from ..torchstate.materialize import read_blobs as _read
    repo.core.index.refresh()
    return _read(repo.core, vid, m, blobs, seeds=seeds)


def refresh_index(repo: Handle) -> None:
    """Load the index files written since the handle last looked (by it or another process)."""
    repo.core.index.refresh()


def read_chunk(repo: Handle, chunk_id: bytes) -> Any:
    """One chunk's bytes, its delta chain walked and checked."""
    return repo.core.chunks.read_chunk(chunk_id)


def metered(repo: Handle) -> tuple[Handle, ReadMeter]:
    """A fresh handle on ``repo``'s store through a byte-counting view (what a rollback reads is
    then measured, not guessed): (handle, meter).  The caller closes the handle."""
    meter = ReadMeter(repo.core.store)
    return type(repo)(meter), meter


# background work -----------------------------------------------------------------------------------

def run_after(repo: Handle, fn: Callable[[], Any]) -> SaveHandle:
    """Queue ``fn`` on the handle's save thread, after the saves already submitted (a
    Checkpointer's gc, a drill, a framework's pointer file).  Its error surfaces like a save's."""
    from ..snapshot import async_save
    return async_save.run_after(repo.runtime, fn)


def prepare_staging(repo: Handle, leaves: "list[TensorLeaf]", where: str | None = None) -> threading.Thread | None:
    """Fault in, in a thread of the handle, the staging memory background saves of ``leaves``
    will hold (``max_in_flight`` copies)."""
    from ..snapshot import async_save
    runtime = repo.runtime
    return runtime.prefault(leaves, async_save.uses_process(runtime, leaves, where), runtime.options.max_in_flight)


def unhook_finished_snapshots(repo: Handle) -> None:
    """Unregister finished lazy copies from their optimizers (call between steps)."""
    if repo._runtime is not None:
        repo._runtime.forget_done_lazy()


def wait_snapshots() -> None:
    """Wait for every lazy snapshot copy of this process (before writing into live tensors)."""
    from .loading import wait_snapshots as _wait
    _wait()


def set_deltify_lag(repo: Handle, lag: int) -> None:
    """Leave the ``lag`` newest versions as saved (a keep_last retention: versions it is about to
    drop never cost a delta write)."""
    repo.session.deltify_lag = max(repo.session.deltify_lag, lag)


def collect(repo: Handle, policy: Retention, *, grace_seconds: float = DEFAULT_GRACE_SECONDS) -> GcReport:
    """Run gc with ``policy`` through the handle's write session."""
    return run_gc(repo.session, policy, grace_seconds=grace_seconds)


def drill(repo: Handle, vid: str, *, idle: bool = False, label: str | None = None) -> DrillReport:
    return run_drill(repo.core, vid, idle=idle, label=label)


# events and holds ----------------------------------------------------------------------------------

def stamp(kind: str) -> dict[str, Any]:
    return _events.stamp(kind)


def record_event(repo: Handle, record: dict[str, Any]) -> str:
    return _events.write(repo.core, record)


def events_of(repo: Handle, kind: str | None = None) -> list[Event]:
    """Usable event records of ``kind``, newest first."""
    return _events.usable(repo.core, kind)


def abandoned_versions(repo: Handle) -> set[str]:
    """Versions an earlier rollback abandoned (never a rollback target again)."""
    return _events.abandoned(repo.core)


def hold(repo: Handle) -> Hold:
    """A new hold on ``repo``'s versions (gc keeps what it holds while this process lives)."""
    return Hold(repo.core.store)


# writers whose commit happens elsewhere (DCP) --------------------------------------------------

def store(repo: Handle) -> Store:
    return repo.core.store


def save_lease(repo: Handle) -> locks.SaveLease:
    """A save lock held across calls (keeps gc out until released)."""
    return locks.acquire_save(repo.core.store)


def store_blobs(repo: Handle, inputs: list[BlobInput], *, workers: int | None = None) -> tuple[list[Blob], SaveStats]:
    """Write chunks and commit nothing (:func:`deltackpt.repo.write.saver.store_blobs`)."""
    return saver.store_blobs(repo.session, inputs, workers=workers)


def commit_manifest(repo: Handle, m: Manifest, *, tag: str | None = None) -> str:
    """Commit a manifest whose blobs are already stored; returns the version id."""
    return saver.commit_manifest(repo.session, m, tag=tag)
