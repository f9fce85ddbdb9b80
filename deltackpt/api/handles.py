"""A repository handle: the one owner of everything work on a repository starts and holds.

:class:`Handle` (the base of :class:`deltackpt.Repo`) holds the torch-free
:class:`~deltackpt.repo.repository.Repository` it reads, the
:class:`~deltackpt.repo.write.session.WriteSession` its saves write through (settings, the delta
bases kept between saves; made at the first save, so a handle that only reads never imports the
write path) and, once a background save needs it, a
:class:`~deltackpt.snapshot.runtime.SaveRuntime` (the save thread, staging memory, lazy copies,
the encoder process).  :meth:`Handle.close` finishes the background work and releases all of it.
Nothing is shared between handles and nothing is kept per process: a function given a path
(``deltackpt.save(state, "ckpt")``) opens a handle for that call and closes it before returning
(:func:`opened`).

Example::

    with Handle("ckpt", create=True) as h:
        print(h.core.latest())
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import InvalidArgumentError
from ..format import config as config_fmt
from ..repo.repository import Repository
from ..store.base import Store

if TYPE_CHECKING:
    from ..repo.write.session import WriteSession
    from ..snapshot.runtime import BackgroundOptions, SaveRuntime

DELTIFY_ENV = "DELTACKPT_DELTIFY"


def _deltify_default() -> bool:
    """``$DELTACKPT_DELTIFY`` (``off``/``0``/``no``/``false`` turn it off), read when a handle opens."""
    return os.environ.get(DELTIFY_ENV, "on").strip().lower() not in ("0", "off", "no", "false")


class Handle:
    """An open repository and everything its work holds (see the module docstring).

    ``delta_cache_bytes``: memory for the delta bases the next save computes its deltas against,
    and for the 16 KiB samples it judges dense positions on again (0: none, both are read back
    when needed; default a tenth of the state last saved).  ``background``: how background saves run (``"thread"``, ``"process"`` or a
    :class:`~deltackpt.snapshot.runtime.BackgroundOptions`).  ``deltify``: re-store older versions
    as reverse deltas after each save (default ``$DELTACKPT_DELTIFY``, on).  The other options
    are :class:`deltackpt.Repo`'s.
    """

    core: Repository
    """The torch-free repository this handle reads and writes (internal: see :mod:`.internal`)."""

    def __init__(self, location: "str | os.PathLike[str] | Store | Handle", *, create: bool = False,
                 chunk_bytes: int | None = None, keyframe_interval: int | None = None,
                 delta_cache_bytes: int | None = None, level: int | None = None, delta_base: str | None = None,
                 background: "str | BackgroundOptions | None" = None, deltify: bool | None = None,
                 payback: float | None = None) -> None:
        # a handle: the same store object (a memory store has no path)
        where = location.core.store if isinstance(location, Handle) else location

        if delta_cache_bytes is not None and (isinstance(delta_cache_bytes, bool) or not isinstance(delta_cache_bytes, int)
                                              or delta_cache_bytes < 0):
            raise InvalidArgumentError(f"delta_cache_bytes must be an integer >= 0, got {delta_cache_bytes!r:.60}")
        if deltify is not None and not isinstance(deltify, bool):
            raise InvalidArgumentError(f"deltify must be True or False, got {deltify!r:.60}")
        if payback is not None:
            from ..repo.write.session import check_payback
            check_payback(payback)   # before a repository is created
        if level is not None:
            from ..codecs.base import check_level
            check_level(level)   # before a repository is created
        self._background = _checked_background(background)
        self.core = Repository(where, create=create, chunk_bytes=chunk_bytes, keyframe_interval=keyframe_interval,
                               delta_base=delta_base)
        # the write settings are refused now, as an open with them; the session itself (and the
        # write path's modules) is made at the first save: a handle that only reads never needs it
        config_fmt.check_overrides(chunk_bytes, keyframe_interval, delta_base, self.core.config.version)
        self._session_args: dict[str, Any] = dict(
            chunk_bytes=chunk_bytes, keyframe_interval=keyframe_interval, delta_base=delta_base, level=level,
            delta_cache_bytes=delta_cache_bytes, deltify=_deltify_default() if deltify is None else deltify,
            **({} if payback is None else {"payback": payback}))
        self._session: WriteSession | None = None
        self._session_lock = threading.Lock()
        self._runtime: SaveRuntime | None = None
        self._closed = False

    @property
    def session(self) -> "WriteSession":
        """What this handle's saves write through (settings, the delta bases kept between saves),
        made at first use."""
        with self._session_lock:
            if self._session is None:
                if self._closed:
                    raise InvalidArgumentError(f"{self.core.location}: this repository handle is closed")
                from ..repo.write.session import WriteSession
                self._session = WriteSession(self.core, **self._session_args)
            return self._session

    @property
    def runtime(self) -> "SaveRuntime":
        """The handle's background-save runtime (made at the first background save)."""
        if self._runtime is None:
            if self._closed:
                raise InvalidArgumentError(f"{self.core.location}: this repository handle is closed")
            from ..snapshot.runtime import SaveRuntime, background_options
            self._runtime = SaveRuntime(self.session, background_options(self._background))
        return self._runtime

    @property
    def closed(self) -> bool:
        return self._closed

    def wait(self) -> None:
        """Wait for the background saves made to this repository in this process (this handle's,
        then other handles'), so that what follows sees them committed; raise the first error
        nobody observed."""
        from ..snapshot import at_exit   # torch-free: the process's record of background saves
        if self._runtime is not None:
            self._runtime.drain()
        for other in at_exit.others_for(self.core.location, self._runtime):
            other.drain()

    def close(self) -> None:
        """Finish this handle's background saves, free its staging memory and delta bases, and
        join every thread and process it started; afterwards nothing of it runs or writes.  Raises
        the first background error nobody observed (once everything is released)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._runtime is not None:
                self._runtime.close()
        finally:
            if self._session is not None:
                self._session.close()
            self.core.close()

    def release(self) -> None:
        """Free what the handle holds without waiting for anything (its background saves are done:
        a handle opened for one background save calls this from the save thread as its last act)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._runtime is not None:
                self._runtime.release()
        finally:
            if self._session is not None:
                self._session.close()
            self.core.close()

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _checked_background(value: "str | BackgroundOptions | None") -> "str | BackgroundOptions | None":
    """Refuse a bad ``background`` now, before anything is opened (torch-free for a string)."""
    if value is None or value in ("thread", "process"):
        return value
    if isinstance(value, str):
        raise InvalidArgumentError(f"background must be 'thread' or 'process', got {value!r:.60}")
    from ..snapshot.runtime import background_options
    return background_options(value)


@contextmanager
def opened(location: "str | os.PathLike[str] | Store | Handle", *, create: bool = False) -> Iterator[Handle]:
    """The handle to work through: ``location`` itself when it is one (left open), else a handle
    opened for the block and closed after it."""
    if isinstance(location, Handle):
        try:
            yield location
        finally:   # what this call decoded served it only: the handle keeps no decoded chunks
            location.core.chunks.decoded.clear()
        return
    handle = Handle(location, create=create)
    try:
        yield handle
    finally:
        handle.close()


def portable_location(repo: "str | os.PathLike[str] | Store | Handle") -> "str | Store":
    """What reopens ``repo`` in another process (pickling, spawned ranks): an absolute path or a
    URL; a Store that is neither local nor fsspec is returned as it is (it pickles or it does not).

    ``portable_location("ckpt")`` -> ``"/abs/ckpt"``"""
    from ..store.fsspec_store import FsspecStore
    from ..store.local import LocalStore
    if isinstance(repo, Handle):
        repo = repo.core.store
    if type(repo) in (LocalStore, FsspecStore) and isinstance(repo, Store):
        return repo.describe()
    if isinstance(repo, Store):
        return repo
    text = os.fspath(repo)
    return text if "://" in text else os.path.abspath(text)
