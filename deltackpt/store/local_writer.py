"""The local store's streaming writer (a pack is written as the encoders produce it), and the OS
error translation the store shares with it."""

from __future__ import annotations

import errno
import os
import secrets
from typing import Protocol, cast

from .. import faults
from ..errors import ObjectNotFoundError, StoreError
from ..threads import BackgroundCall
from .base import AtomicWriter, Store
from .staged_write import StagedFile, StagePool, close_quiet


class LocalPaths(Protocol):
    """What the writer uses of its :class:`~.local.LocalStore` (which imports this module, so this
    one names the methods instead of importing it)."""

    def _tmp_dir(self) -> str: ...

    def _path(self, key: str) -> str: ...

    def _check_dirs(self, path: str) -> None: ...

    def _makedirs(self, path: str) -> None: ...

    def _fsync_dir(self, path: str, site: str) -> None: ...

WRITEBACK_BYTES = 8 << 20
"""A streaming writer fdatasyncs its temp file in a background thread every this many bytes, so
the disk (and on a VM, the host's cache flush) works while the caller produces the rest, and the
fsync at commit waits only for the tail.  Durability still comes from that final fsync.  Not for
a file written past the page cache (staged_write.py): its bytes reach the disk as they are written."""


def os_error(exc: OSError, action: str, key: str) -> StoreError:
    """The store's error for an OS error on ``key``: reading (or deleting) a missing file is
    ObjectNotFoundError; any other failure, a write into a folder that is missing, read-only or not
    a folder among them, names the file the OS refused and the OS's reason in one line."""
    if isinstance(exc, FileNotFoundError) and action != "write":
        return ObjectNotFoundError(f"{action} {key!r}: no such object")
    where = f"{exc.filename}: " if exc.filename and str(exc.filename) != key else ""
    hint = " (disk full: free space and retry; committed versions are intact)" if exc.errno == errno.ENOSPC else ""
    return StoreError(exc.errno or errno.EIO, f"cannot {action} {key!r}: {where}{exc.strerror or exc}{hint}")


def owned_temp(name: str, owner: str) -> bool:
    """Whether the temp file ``name`` (under ``tmp/``) was written for ``owner`` (a save lock's name)."""
    return name.startswith(tuple(f"{site}.{owner}." for site in ("pack",)))


class LocalWriter(AtomicWriter):
    """Streams into a temp file; commit = fsync, rename into place, fsync the directory.  A
    sealed file (fsynced, closed) stays under ``tmp/`` until :meth:`publish` renames it."""

    def __init__(self, store: LocalPaths, site: str, owner: str | None = None,
                 stages: StagePool | None = None) -> None:
        super().__init__(cast(Store, store), site)   # a LocalStore: a Store and LocalPaths both
        self._local = store
        tmp_dir = store._tmp_dir()
        mark = f"{owner}." if owner else ""   # see owned_temp: a dead save's files are found by it
        self._tmp = os.path.join(tmp_dir, f"{site}.{mark}{secrets.token_hex(6)}.tmp")
        self._key: str | None = None          # sealed for this key, not yet published
        self._fd: int | None = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                       | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._synced = 0                              # bytes a background fdatasync was started for
        self._sync: BackgroundCall | None = None      # at most one in flight
        self._sync_error: OSError | None = None
        self._staged: StagedFile | None = None        # from the first write to the seal (staged_write.py)
        self._stages = stages                         # the pool its stages come from, if its owner has one

    def _background_sync(self) -> None:
        """Start an fdatasync of what is written so far, unless one is still running."""
        if self._sync is not None:
            if self._sync.running():
                return
            # kept: a later fsync may not report an error this one consumed
            self._sync_error = self._sync_error or self._sync.join()
        fd = self._fd
        assert fd is not None   # write() checked it
        self._synced = self.size
        self._sync = BackgroundCall(lambda: os.fdatasync(fd), "deltackpt-writeback")

    def _join_sync(self) -> None:
        """Wait for the background fdatasync (before the fd is fsynced or closed); raise its error."""
        if self._sync is not None:
            self._sync_error = self._sync_error or self._sync.join()
            self._sync = None
        if self._sync_error is not None:
            exc, self._sync_error = self._sync_error, None
            raise exc

    def write(self, data: bytes | memoryview) -> None:
        assert self._fd is not None
        try:
            short = faults.hit(f"{self._site}.write")
            view = memoryview(data)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            if short:
                os.write(self._fd, view[: len(view) // 2])
                raise OSError(errno.EIO, f"injected short write at {self._site}.write")
            if self._staged is None:
                self._staged = StagedFile(self._tmp, self._fd, self._stages)
            self._staged.write(view)
            self.size += len(data)
            # (a file written directly is on the disk as it goes: nothing for a sync to start)
            if self.size - self._synced >= WRITEBACK_BYTES and hasattr(os, "fdatasync") and not self._staged.direct:
                self._background_sync()
        except OSError as exc:
            self.abort()
            raise os_error(exc, "write", self._tmp) from None

    def commit(self, key: str) -> None:
        self.seal(key)
        self.publish()

    def seal(self, key: str) -> None:
        assert self._fd is not None
        try:
            self._local._check_dirs(self._local._path(key))
            if self._staged is not None:
                self._staged.finish()
                self._staged = None
            self._join_sync()
            faults.hit(f"{self._site}.fsync")
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            self._key = key
        except OSError as exc:
            self.abort()
            raise os_error(exc, "write", key) from None

    def publish(self) -> None:
        key = self._key
        assert key is not None
        path = self._local._path(key)
        try:
            self._local._check_dirs(path)
            self._local._makedirs(os.path.dirname(path))
            faults.hit(f"{self._site}.rename")
            os.replace(self._tmp, path)
            self._key = None
            self._local._fsync_dir(os.path.dirname(path), self._site)
        except OSError as exc:
            self.abort()
            raise os_error(exc, "write", key) from None

    def abort(self) -> None:
        if self._sync is not None:
            self._sync.join()  # never close an fd a background fdatasync still uses
            self._sync = None
        self._sync_error = None
        if self._staged is not None:
            self._staged.close()   # before the descriptor its thread writes through is closed
            self._staged = None
        if self._fd is not None:
            close_quiet(self._fd)
            self._fd = None
        self._key = None
        unlink_quiet(self._tmp)  # after a publish: already renamed, nothing to delete


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
