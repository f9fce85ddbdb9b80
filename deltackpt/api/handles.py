"""Opening a repository: one :class:`Repository` per location and process, shared by every handle.

Every public function takes a path, a URL, a :class:`~deltackpt.store.base.Store` or a
:class:`deltackpt.Repo`; :func:`open_core` turns any of them into this process's Repository for
that location.  Sharing it is what lets the delta cache (the last saved bytes, which the next save
stores its deltas against) outlive single ``deltackpt.save(obj, path)`` calls.

Example::

    core = open_core("ckpt", create=True)
    assert open_core("./ckpt") is core
"""

from __future__ import annotations

import os

from ..repo.layout import DEFAULT_DELTA_CACHE_BYTES
from ..repo.repository import Repository
from ..store.base import Store

_OPEN: dict[str, Repository] = {}


class Handle:
    """An open repository (``core``): the base of :class:`deltackpt.Repo`, so that this module can
    accept a Repo without importing the class built on it."""

    core: Repository


def open_core(location: "str | os.PathLike | Store | Handle", *, create: bool = False,
              chunk_bytes: int | None = None, keyframe_interval: int | None = None,
              delta_cache_bytes: int | None = None, level: int | None = None,
              delta_base: str | None = None) -> Repository:
    """This process's Repository for ``location`` (opened, or created with ``create=True``, on
    first use); the options given change the open one's settings for later saves."""
    if isinstance(location, Handle):
        return location.core
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
        from ..codecs.base import check_level
        from ..format.config import check_chunk_bytes, check_delta_base, check_keyframe_interval
        # every option checked before any is applied: a refused one leaves the handle as it was
        for value, check in ((chunk_bytes, check_chunk_bytes), (keyframe_interval, check_keyframe_interval),
                             (level, check_level), (delta_base, lambda b: check_delta_base(b, core.config.version))):
            if value is not None:
                check(value)
        if chunk_bytes is not None:
            core.config.chunk_bytes = chunk_bytes
        if keyframe_interval is not None:
            core.config.keyframe_interval = keyframe_interval
        if delta_cache_bytes is not None:
            core.delta_cache.max_bytes = delta_cache_bytes
        if level is not None:
            core.level = level
        if delta_base is not None:
            core.config.delta_base = delta_base
    return core


def forget(core: Repository) -> None:
    """Drop ``core`` from the open handles: the next open of its location reads it afresh."""
    for key, open_one in list(_OPEN.items()):
        if open_one is core:
            del _OPEN[key]


def portable_location(repo: "str | os.PathLike | Store | Handle") -> "str | Store":
    """What reopens ``repo`` in another process (pickling, spawned ranks): an absolute path or a
    URL; a Store that is neither local nor fsspec is returned as it is (it pickles or it does not).

    ``portable_location("ckpt")`` -> ``"/abs/ckpt"``"""
    from ..store.fsspec_store import FsspecStore
    from ..store.local import LocalStore
    if isinstance(repo, Handle):
        repo = repo.core.store
    if type(repo) in (LocalStore, FsspecStore):
        return repo.describe()
    if isinstance(repo, Store):
        return repo
    text = os.fspath(repo)
    return text if "://" in text else os.path.abspath(text)
