"""A deltackpt repository over any Store: config, index, manifests, refs and revisions (chunk reads:
``read/reader.py``; key layout: ``layout.py``).

Layout (keys in the store)::

    config                     format name and version (read first, refused if unknown)
    packs/<2 hex>/<pack id>    objects; pack id = xxh3-128 of the pack's bytes
    index/<index id>           chunk id -> pack location; union of all files is the index
    manifests/<version id>     one per version; version id = xxh3-128 of the manifest's bytes
    refs/latest                the newest version (branch head)
    refs/tags/<name>           tags
    locks/                     save (shared), gc (exclusive), refs (mutex), holds (versions gc keeps)
    events/<event id>          optional records of rollbacks and drills (events.py)
    tmp/                       temp files of writes in flight (local stores)
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple

from ..errors import (AmbiguousVersionError, DeltackptError,
                      NotARepositoryError, ObjectNotFoundError, StoreError, UnknownVersionError)
from ..format import config as config_fmt
from ..format import index as index_fmt
from ..format import manifest as manifest_fmt
from ..format import refs
from ..format.ids import is_hex_prefix
from ..format.limits import MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, MAX_REF_BYTES
from ..format.manifest import Manifest
from ..store.base import Store
from ..store.local import LocalStore
from .layout import CONFIG, DEFAULT_DECODED_CACHE_BYTES, LATEST_REF, MANIFESTS, TAGS
from .read.index_state import Index
from .read.reader import ChunkReader, DecodedCache
from .versions import Version


def open_store(location: "str | os.PathLike | Store") -> Store:
    if isinstance(location, Store):
        return location
    text = os.fspath(location)
    if "://" in text and not text.startswith("file://"):
        from ..store.fsspec_store import FsspecStore  # optional dependency
        return FsspecStore(text)
    return LocalStore(text[7:] if text.startswith("file://") else text)


def _check_settings(chunk_bytes: int | None, keyframe_interval: int | None) -> None:
    """InvalidArgumentError for a setting a config could not hold (``None``: not given)."""
    if chunk_bytes is not None:
        config_fmt.check_chunk_bytes(chunk_bytes)
    if keyframe_interval is not None:
        config_fmt.check_keyframe_interval(keyframe_interval)


#: decoded manifests a handle keeps (the newest read): a save needs its parent's, a load its version's
MANIFESTS_KEPT = 8


class ManifestHead(NamedTuple):
    """What a manifest says of its version besides its tensors: what orders the history and what
    retention rules read, kept for every version a handle has read (a few hundred bytes each)."""

    time: float
    parent: str | None
    step: int | None
    metrics: dict


def _head_of(m: Manifest) -> ManifestHead:
    return ManifestHead(m.time, m.parent, m.step, m.metrics)


def _sort_time(t: float) -> float:
    """A manifest's time as a sort key: NaN (which compares with nothing) sorts oldest."""
    return t if t == t else -math.inf


def _written_bytes(extra: dict[str, Any]) -> int | None:
    """The writer's count of bytes it wrote, from a manifest's ``extra``; None when it holds no
    usable one (readers MUST NOT need ``extra``: an odd value there is unknown, not an error)."""
    written = extra.get("written")
    if not isinstance(written, dict):
        return 0 if written is None else None
    n = written.get("bytes", 0)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


class Repository:
    """Torch-free access to one repository: its config, manifests, refs and revisions, composed
    with its :class:`~.read.index_state.Index` (``index``) and :class:`~.read.reader.ChunkReader`
    (``chunks``).  It holds no writer state: a save's delta bases and deltification's memory live
    in a :class:`~.write.session.WriteSession`, which the public :class:`deltackpt.Repo` handle owns.

    ``chunk_bytes``, ``keyframe_interval`` and ``delta_base`` are written into the config when
    ``create`` makes the repository; an existing one keeps its own (a handle's saves may override
    them: ``WriteSession``).

    Example::

        repo = Repository("ckpt")
        vid = repo.resolve("latest~1")
        data = repo.chunks.read_chunk(repo.manifest(vid).blobs[0].chunks[0].chunk_id)
    """

    def __init__(self, location: "str | os.PathLike | Store", *, create: bool = False,
                 chunk_bytes: int | None = None, keyframe_interval: int | None = None,
                 delta_base: str | None = None) -> None:
        _check_settings(chunk_bytes, keyframe_interval)   # before anything is written
        self.store = open_store(location)
        self.location = self.store.describe()
        try:
            try:
                raw = self.store.get_bounded(CONFIG, MAX_CONFIG_BYTES)
            except (ObjectNotFoundError, FileNotFoundError):
                if not create:
                    raise NotARepositoryError(f"{self.location}: not a deltackpt repository (no config); "
                                              "create one with `deltackpt init` or by saving to it") from None
                self._init(chunk_bytes, keyframe_interval, delta_base)
                raw = self.store.get_bounded(CONFIG, MAX_CONFIG_BYTES)
        except StoreError as exc:  # the path is a file, unreadable, ...: say which repository
            if type(exc) is not StoreError or self.location in str(exc):
                raise
            raise StoreError(f"{self.location}: {exc}") from None
        self.config = config_fmt.decode(raw, where=self.location)
        self.index = Index(self.store, self.location)
        self.chunks = ChunkReader(self.store, self.index, DecodedCache(DEFAULT_DECODED_CACHE_BYTES))
        # the manifests read last, decoded (a save reads its parent's, a load its version's); of
        # every other version only when it was written and what it follows, which is all the
        # history's order needs: a handle that kept every manifest grew by about a manifest per
        # save (132 MiB after 200 saves of an 8 MB state)
        self._manifests: OrderedDict[str, Manifest] = OrderedDict()
        self._heads: dict[str, ManifestHead] = {}
        self._cache_lock = threading.Lock()
        self.index.refresh()

    def close(self) -> None:
        """Drop what this object keeps in memory (manifests, the index, decoded chunks)."""
        with self._cache_lock:
            self._manifests.clear()
            self._heads.clear()
        self.index.forget()
        self.chunks.decoded.clear()

    def _init(self, chunk_bytes: int | None, keyframe_interval: int | None, delta_base: str | None) -> None:
        cfg = config_fmt.Config(repo_id=secrets.token_hex(16), created=time.time())
        if delta_base is not None:
            cfg.delta_base = config_fmt.check_delta_base(delta_base)
        if chunk_bytes is not None:
            cfg.chunk_bytes = chunk_bytes
        if keyframe_interval is not None:
            cfg.keyframe_interval = keyframe_interval
        self.store.put_if_absent(CONFIG, cfg.to_bytes(), site="config")

    # manifests and versions -----------------------------------------------------------------
    def version_ids(self) -> list[str]:
        out = []
        for key in self.store.list(MANIFESTS):
            name = key[len(MANIFESTS):]
            if len(name) == 32 and is_hex_prefix(name):
                out.append(name)
        return out

    def manifest(self, vid: str) -> Manifest:
        """Version ``vid``'s manifest, decoded (the last MANIFESTS_KEPT read are kept)."""
        with self._cache_lock:
            m = self._manifests.get(vid)
            if m is not None:
                self._manifests.move_to_end(vid)
                return m
        m = manifest_fmt.decode(self._manifest_bytes(vid), version_id=vid)
        self.remember_manifest(vid, m)
        return m

    def remember_manifest(self, vid: str, m: Manifest) -> None:
        """Keep ``m`` as version ``vid``'s manifest: a save that just committed it hands it over,
        so the step after the save and the next save do not read and decode it back (0.8 ms a save
        on the 4 MB CNN, 4.6 ms on MiniLM).  ``m`` must be what decoding the committed bytes gives."""
        with self._cache_lock:
            self._heads[vid] = _head_of(m)
            self._manifests[vid] = m
            self._manifests.move_to_end(vid)
            while len(self._manifests) > MANIFESTS_KEPT:
                self._manifests.popitem(last=False)

    def _manifest_bytes(self, vid: str) -> bytes:
        try:
            return self.store.get_bounded(MANIFESTS + vid, MAX_MANIFEST_BYTES)
        except (ObjectNotFoundError, FileNotFoundError):
            raise UnknownVersionError(f"version {vid} has no manifest in {self.location}") from None

    def head(self, vid: str) -> ManifestHead:
        """Version ``vid``'s manifest's time, parent, step and metrics, read once (a manifest never
        changes) and without building its tensors: ordering a long history reads every version's."""
        h = self._heads.get(vid)
        if h is not None:
            return h
        parent, t, step, metrics = manifest_fmt.decode_head(self._manifest_bytes(vid), version_id=vid)
        h = ManifestHead(t, parent, step, metrics)
        with self._cache_lock:
            self._heads[vid] = h
        return h

    def require_present(self) -> None:
        """Raise NotARepositoryError when the repository this handle opened is no longer there (its
        folder deleted or moved, or another repository created in its place) since the handle read
        its config.  Writers call it before writing anything: a handle outlives its files, and a save
        into a folder without a config returns an id no one can read back."""
        try:
            raw = self.store.get_bounded(CONFIG, MAX_CONFIG_BYTES)
        except (ObjectNotFoundError, FileNotFoundError):
            raise NotARepositoryError(f"{self.location}: the repository is gone (no config): it was deleted or "
                                      "moved after this handle opened it; nothing was written") from None
        if config_fmt.decode(raw, where=self.location).repo_id != self.config.repo_id:
            raise NotARepositoryError(f"{self.location}: another repository replaced the one this handle opened "
                                      "(its repo_id differs); nothing was written: open it again")

    def forget_manifest(self, vid: str) -> None:
        with self._cache_lock:
            self._manifests.pop(vid, None)
            self._heads.pop(vid, None)

    def version(self, vid: str, tags_by_version: dict[str, list[str]] | None = None, *,
                manifest: Manifest | None = None) -> Version:
        """The Version ``vid`` names; ``manifest``: its manifest when the caller holds it (a save
        that just committed it), which spares reading and decoding it back.  Otherwise a manifest
        this handle holds decoded is used, else only the summary of it is decoded
        (:func:`~deltackpt.format.manifest.decode_summary`: not its tensors and blobs)."""
        if manifest is None:
            with self._cache_lock:
                manifest = self._manifests.get(vid)
        if tags_by_version is None:
            tags_by_version = self.tags_by_version()
        s = manifest_fmt.ManifestSummary.of(manifest) if manifest is not None else self.summary(vid)
        return Version(id=vid, parent=s.parent, time=s.time, step=s.step, metrics=dict(s.metrics), meta=s.meta,
                       tags=tuple(sorted(tags_by_version.get(vid, []))), exact=s.exact, logical_bytes=s.logical_bytes,
                       written_bytes=_written_bytes(s.extra))

    def summary(self, vid: str) -> manifest_fmt.ManifestSummary:
        """Version ``vid``'s manifest summarized (:func:`~deltackpt.format.manifest.decode_summary`:
        head, meta, extra, exactness, logical bytes; its tensors and blobs are not built)."""
        s = manifest_fmt.decode_summary(self._manifest_bytes(vid), version_id=vid)
        with self._cache_lock:
            self._heads.setdefault(vid, ManifestHead(s.time, s.parent, s.step, s.metrics))
        return s

    def newest_first(self) -> "list[tuple[str, DeltackptError | None]]":
        """Every version id, newest first by its manifest's head (time, then id), with None, or
        with the typed error that makes its manifest unusable (placed by its file's modification
        time, the only date it still has).  Only the heads are decoded: what orders a listing
        (:meth:`listing`) and the versions ``resume`` tries."""
        order: list[tuple[float, str, DeltackptError | None]] = []
        for vid in self.version_ids():
            try:
                order.append((_sort_time(self.head(vid).time), vid, None))
            except DeltackptError as exc:
                order.append((self._damaged_time(vid), vid, exc))
        order.sort(key=lambda r: (r[0], r[1]), reverse=True)
        return [(vid, err) for _t, vid, err in order]

    def listing(self, limit: int | None = None) -> "list[tuple[str, Version | DeltackptError]]":
        """The newest ``limit`` versions (every one by default) as :meth:`version` describes them,
        or the typed error that makes a manifest unusable, in :meth:`newest_first`'s order; only
        the summary of those listed is decoded (100 versions of 320 tensors: 1.14 s decoded
        whole, 0.23 s so)."""
        tags = self.tags_by_version()
        rows: list[tuple[str, Version | DeltackptError]] = []
        for vid, err in self.newest_first()[:limit]:
            if err is None:
                try:
                    rows.append((vid, self.version(vid, tags)))
                    continue
                except DeltackptError as exc:
                    err = exc
            rows.append((vid, err))
        return rows

    # refs and tags --------------------------------------------------------------------------
    def read_ref_bytes(self, key: str) -> bytes | None:
        """The ref file's bytes as stored (what a compare-and-swap compares), None when absent."""
        try:
            return self.store.get_bounded(key, MAX_REF_BYTES)
        except (ObjectNotFoundError, FileNotFoundError):
            return None

    def read_ref(self, key: str) -> str | None:
        data = self.read_ref_bytes(key)
        return None if data is None else refs.decode_ref(data, what=key)

    def latest(self) -> str | None:
        return self.read_ref(LATEST_REF)

    def tags(self) -> dict[str, str]:
        out = {}
        for key in self.store.list(TAGS):
            name = key[len(TAGS):]
            try:
                refs.check_name(name)
            except DeltackptError:
                continue  # not a tag we would have written; ignored (verify reports it)
            vid = self.read_ref(key)
            if vid:
                out[name] = vid
        return out

    def tags_by_version(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, vid in self.tags().items():
            out.setdefault(vid, []).append(name)
        return out

    def resolve(self, revision: "str | Version") -> str:
        """Full version id for an id, an id prefix (>= 4 hex), a tag, ``latest``, ``X~N`` or
        ``best:METRIC[:min|max]``."""
        if isinstance(revision, Version):
            return revision.id
        rev = refs.parse_revision(revision)
        base = rev.base
        vid: str | None
        if base == refs.LATEST or base == "HEAD":
            vid = self.latest()
            if vid is None:
                raise UnknownVersionError(f"{self.location} has no versions yet")
        elif base.startswith("best:"):
            vid = self._best(base)
        else:
            vid = None
            if refs.is_tag_name(base):  # never 4-32 hex: an id prefix is never shadowed by a tag
                try:
                    vid = self.read_ref(TAGS + base)
                except DeltackptError:
                    pass
            if vid is None:
                if not (4 <= len(base) <= 32 and is_hex_prefix(base)):
                    raise UnknownVersionError(f"no tag or version {base!r} in {self.location}"
                                              f"{refs.did_you_mean(base, self._revision_names(), '{}' + (f'~{rev.back}' if rev.back else ''))}")
                matches = [v for v in self.version_ids() if v.startswith(base)]
                if not matches:
                    raise UnknownVersionError(f"no version with id prefix {base!r} in {self.location}")
                if len(matches) > 1:
                    raise AmbiguousVersionError(f"version prefix {base!r} matches {len(matches)} versions; "
                                                "type more characters")
                vid = matches[0]
        for i in range(rev.back):
            parent = self.manifest(vid).parent
            if parent is None:
                raise UnknownVersionError(f"{revision!r}: version {vid[:10]} has only {i} ancestors")
            if not self.store.exists(MANIFESTS + parent):
                raise UnknownVersionError(f"{revision!r}: ancestor {parent[:10]} was removed by gc")
            vid = parent
        return vid

    def _revision_names(self) -> list[str]:
        """The names a revision may be spelt with besides ids: latest, HEAD, the tags, and
        best:METRIC for the newest version's metrics (what a "did you mean" picks from)."""
        names = [refs.LATEST, "HEAD"]
        # a guess never replaces the error it decorates: a tags folder or newest version that
        # cannot be read (a symlink, damage) leaves its names out
        try:
            names += [k[len(TAGS):] for k in self.store.list(TAGS)]
        except DeltackptError:
            pass
        try:
            vid = self.latest()
            if vid is not None:
                names += [f"best:{metric}" for metric in self.manifest(vid).metrics]
        except DeltackptError:
            pass
        return names

    def _best(self, base: str) -> str:
        metric, direction = refs.parse_best(base)
        sign = -1 if direction == "max" else 1
        best: tuple[float, float, str] | None = None
        recorded: dict[str, None] = {}
        for vid, err in self.newest_first():   # the heads hold time and metrics: no manifest built
            if err is not None:
                continue  # a damaged version is no candidate; it does not hide the others either
            m = self.head(vid)
            recorded.update(dict.fromkeys(m.metrics))
            value = m.metrics.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                cand = (sign * float(value), -_sort_time(m.time), vid)
                if best is None or cand < best:
                    best = cand
        if best is None:
            suffix = base[len("best:") + len(metric):]   # the :min or :max as given
            raise UnknownVersionError(f"no version records the metric {metric!r}"
                                      f"{refs.did_you_mean(metric, list(recorded), f'best:{{}}{suffix}')}")
        return best[2]

    def history(self) -> list[str]:
        """All versions, newest first (raises on the first manifest that does not parse)."""
        return sorted(self.version_ids(), key=lambda v: (_sort_time(self.head(v).time), v), reverse=True)

    def history_order(self) -> list[str]:
        """Every version, newest first by history: ``latest``, its parent, its parent's parent, ...;
        then the versions not on that line (an ancestor gc removed cuts it; a manifest whose ref never
        moved is not on it), newest first by the time their writer's clock recorded."""
        by_time = self.history()
        present = set(by_time)
        line: list[str] = []
        seen: set[str] = set()
        vid = self.latest()
        while vid is not None and vid in present and vid not in seen:
            line.append(vid)
            seen.add(vid)
            vid = self.head(vid).parent
        return line + [v for v in by_time if v not in seen]

    def _damaged_time(self, vid: str) -> float:
        """Where a version whose manifest is unusable sorts: its file's modification time, the only
        date it still has."""
        try:
            return _sort_time(self.store.mtime(MANIFESTS + vid))
        except (DeltackptError, OSError):
            return -math.inf

    # chunk reads ----------------------------------------------------------------------------
    def encode_index(self, packs: dict[str, tuple[int, list[Any]]]) -> bytes:
        """An index file naming ``packs`` ({pack id: (pack length, entries)}) in the index version
        this repository's format calls for (version 1 in formats 1 and 2: their readers read no other)."""
        return index_fmt.encode(packs, index_fmt.version_for(self.config.version))

    def info(self) -> dict[str, Any]:
        return {"location": self.location, "format_version": self.config.version, "repo_id": self.config.repo_id,
                "chunk_bytes": self.config.chunk_bytes, "keyframe_interval": self.config.keyframe_interval}
