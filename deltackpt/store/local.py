"""A repository on a local filesystem.

Every write goes to ``tmp/`` under the repository, is fsynced, then renamed (or hard-linked, for
create-if-absent) into place, and the target directory is fsynced, so a crash leaves either the
old state or the whole new file.  Reads never follow symbolic links: a repository from a stranger
cannot make us read or write outside it.
"""

from __future__ import annotations

import builtins
import errno
import os
import secrets
import stat
from typing import Sequence

from .. import faults
from ..errors import LimitExceededError, StoreError
from .base import AtomicWriter, MappedValue, Store, check_key
from .local_map import FileMapping
from .local_writer import LocalWriter, owned_temp
from .local_writer import os_error as _os_error
from .local_writer import unlink_quiet as _unlink_quiet
from .staged_write import StagePool

TMP_DIR = "tmp"
PREFETCH_PIECE = 1 << 20
"""Bytes per ``posix_fadvise(WILLNEED)`` of :meth:`LocalStore.prefetch`.  Linux fetches at most
max(read_ahead_kb, max_sectors_kb) of one call and drops the rest of the range: a GPT-2 state's
cold load with read_ahead_kb at its usual 128 KiB took 1.6-1.8 s with a 32 MiB range per hint and
1.1-1.2 s in pieces of this size (about 1,400 calls a 1.4 GB load, ~6 ms of CPU when nothing
needs fetching).  1 MiB: under the 1280 KiB request size of most disks."""


class LocalStore(Store):
    prefetches = True   # posix_fadvise(WILLNEED): the kernel reads ahead into the page cache
    stages_writes = True   # a large file is written past the page cache through stages (staged_write.py)
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self._dirs_ok: set[str] = set()

    def describe(self) -> str:
        return self.root

    # paths -------------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def _check_dirs(self, path: str) -> None:
        """Refuse a key whose parent folders inside the repository are symlinks."""
        parent = os.path.dirname(path)
        if parent in self._dirs_ok:
            return
        rel = os.path.relpath(parent, self.root)
        cur = self.root
        for part in ([] if rel == "." else rel.split(os.sep)):
            cur = os.path.join(cur, part)
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                return
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                raise StoreError(errno.ELOOP, f"{os.path.relpath(cur, self.root)!r} inside the repository is not a "
                                              "plain directory (symbolic links are refused)")
        self._dirs_ok.add(parent)

    def _open_read(self, key: str) -> tuple[int, os.stat_result]:
        """An fd on ``key``'s regular file and its fstat.  O_NONBLOCK: opening a FIFO for reading
        would otherwise wait forever for a writer; the fstat then refuses it (and devices,
        sockets, folders) before anything is read."""
        path = self._path(key)
        self._check_dirs(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(errno.ELOOP, f"{key!r} is a symbolic link; refused") from None
            raise _os_error(exc, "read", key) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(errno.EINVAL, f"{key!r} is not a regular file ({_kind(st.st_mode)}); refused")
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError) and not isinstance(exc, StoreError):
                raise _os_error(exc, "read", key) from None
            raise
        return fd, st

    @staticmethod
    def _pread(fd: int, start: int, length: int) -> bytes:
        data = os.pread(fd, length, start)
        if len(data) < length:  # a short read (rare): collect the rest
            parts = [data]
            got = len(data)
            while got < length:
                part = os.pread(fd, length - got, start + got)
                if not part:
                    break
                parts.append(part)
                got += len(part)
            data = b"".join(parts)
        return data

    # reads -------------------------------------------------------------------------------
    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        fd, st = self._open_read(key)
        try:
            if length is None or start + length > st.st_size:
                # a hostile index may claim any length: never allocate past the file's end
                length = max(st.st_size - start, 0)
            return self._pread(fd, start, length)
        except OSError as exc:
            raise _os_error(exc, "read", key) from None
        finally:
            os.close(fd)

    def read_into(self, key: str, start: int, out: "memoryview | Sequence[memoryview]") -> int:
        if type(self).get is not LocalStore.get or not hasattr(os, "preadv"):
            return super().read_into(key, start, out)   # a subclass's get() reads; no preadv (macOS)
        outs = [out] if isinstance(out, memoryview) else list(out)
        fd, st = self._open_read(key)
        try:
            faults.hit(f"read.{key.split('/', 1)[0]}")   # "read.packs": a read error mid-stream (tests)
            want = max(min(sum(len(o) for o in outs), st.st_size - start), 0)  # never past the end fstat saw
            got = 0
            while got < want:
                n = os.preadv(fd, _pieces(outs, got, want), start + got)
                if n <= 0:
                    break  # the file shrank meanwhile: the caller sees a short read
                got += n
            return got
        except OSError as exc:
            raise _os_error(exc, "read", key) from None
        finally:
            os.close(fd)

    def map_value(self, key: str) -> MappedValue | None:
        if type(self).get is not LocalStore.get:
            return None   # a subclass's get() reads: its bytes may not be the file's
        try:
            fd, st = self._open_read(key)
        except OSError:   # StoreError included: the read that follows reports it
            return None
        try:
            mapping = FileMapping.open(fd, st.st_size)
        finally:
            os.close(fd)
        return None if mapping is None else mapping.for_key(key)

    def prefetch(self, key: str, start: int, length: int) -> None:
        # the kernel reads the range into the page cache in the background (no wait, no memory of
        # ours); only regular files inside the repository are opened, as for a read
        try:
            fd, _st = self._open_read(key)
        except OSError:  # StoreError included: a missing or refused file is the read's to report
            return
        try:
            # a piece at a time: of a longer range, Linux would fetch only the head (PREFETCH_PIECE)
            for at in range(start, start + length, PREFETCH_PIECE):
                os.posix_fadvise(fd, at, min(PREFETCH_PIECE, start + length - at), os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):  # no fadvise (macOS): a hint, nothing lost
            pass
        finally:
            os.close(fd)

    def get_bounded(self, key: str, max_bytes: int) -> bytes:
        """The whole file, refused from its fstat size (nothing read) when above ``max_bytes``:
        a sparse terabyte costs no memory."""
        fd, st = self._open_read(key)
        try:
            if st.st_size > max_bytes:
                raise LimitExceededError(f"{key!r}: {st.st_size} bytes exceeds the limit of {max_bytes} for it")
            return self._pread(fd, 0, st.st_size)  # a file growing meanwhile is cut at the size checked
        except OSError as exc:
            raise _os_error(exc, "read", key) from None
        finally:
            os.close(fd)

    def _stat(self, key: str) -> os.stat_result:
        path = self._path(key)
        self._check_dirs(path)
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise _os_error(exc, "stat", key) from None
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(errno.EINVAL, f"{key!r} is not a regular file (symbolic links are refused)")
        return st

    def size(self, key: str) -> int:
        return self._stat(key).st_size

    def mtime(self, key: str) -> float:
        return self._stat(key).st_mtime

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        out: list[str] = []
        if base != self.root:
            self._check_dirs(os.path.join(base, "_"))  # no symlinked folder on the way (StoreError)
        if not os.path.isdir(base) or os.path.islink(base):
            return out
        # only regular files are keys: symlinks, FIFOs, sockets and devices are never written by
        # a writer, and listing them would send every reader to a file it must refuse
        todo = [base]
        while todo:
            folder = todo.pop()
            rel = os.path.relpath(folder, self.root)
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue  # removed meanwhile (gc) or unreadable: skipped, as os.walk does
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    key = entry.name if rel == "." else f"{rel.replace(os.sep, '/')}/{entry.name}"
                    if key.startswith(prefix):
                        out.append(key)
        return sorted(out)

    # writes ------------------------------------------------------------------------------
    def _makedirs(self, path: str) -> None:
        """Create missing folders and fsync each new folder's parent: a file renamed into a new
        folder is durable only once the folder's own entry is."""
        if not os.path.isdir(self.root):
            os.makedirs(self.root, exist_ok=True)
            self._fsync_dir(os.path.dirname(self.root), "mkdir")
        missing = []
        cur = path
        while cur.startswith(self.root + os.sep) and not os.path.isdir(cur):
            missing.append(cur)
            cur = os.path.dirname(cur)
        for d in reversed(missing):
            try:
                self._mkdir(d)
            except FileExistsError:
                continue
            self._fsync_dir(os.path.dirname(d), "mkdir")

    def _mkdir(self, path: str) -> None:
        os.mkdir(path)  # one method, so tests/reliability/pagecache.py can record it

    def _tmp_dir(self) -> str:
        """The temp folder, refused when it (or the path to it) is a symbolic link: temp files
        would otherwise be written wherever a stranger's repository points."""
        tmp_dir = os.path.join(self.root, TMP_DIR)
        self._check_dirs(os.path.join(tmp_dir, "_"))
        os.makedirs(tmp_dir, exist_ok=True)
        self._check_dirs(os.path.join(tmp_dir, "_"))
        return tmp_dir

    def _fsync_dir(self, path: str, site: str) -> None:
        faults.hit(f"{site}.dirsync")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_temp(self, key: str, data: bytes, site: str, durable: bool = True) -> str:
        tmp_dir = self._tmp_dir()
        tmp = os.path.join(tmp_dir, f"{key.replace('/', '_')}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            short = faults.hit(f"{site}.write")
            view = memoryview(data)
            if short:
                os.write(fd, view[: len(view) // 2])
                raise OSError(errno.EIO, f"injected short write at {site}.write")
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if durable:
                faults.hit(f"{site}.fsync")
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quiet(tmp)
            raise
        os.close(fd)
        return tmp

    def writer(self, *, site: str = "object", owner: str | None = None, stages: StagePool | None = None) -> AtomicWriter:
        try:
            return LocalWriter(self, site, owner, stages)
        except OSError as exc:
            raise _os_error(exc, "write", site) from None

    def put_atomic(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> None:
        path = self._path(key)
        self._check_dirs(path)
        tmp = None
        try:
            self._makedirs(os.path.dirname(path))
            tmp = self._write_temp(key, data, site, durable)
            faults.hit(f"{site}.rename")
            os.replace(tmp, path)
            tmp = None
            if durable:
                self._fsync_dir(os.path.dirname(path), site)
        except OSError as exc:
            raise _os_error(exc, "write", key) from None
        finally:
            if tmp:
                _unlink_quiet(tmp)

    def put_if_absent(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> bool:
        path = self._path(key)
        self._check_dirs(path)
        tmp = None
        try:
            self._makedirs(os.path.dirname(path))
            if os.path.lexists(path):
                return False
            tmp = self._write_temp(key, data, site, durable)
            faults.hit(f"{site}.link")
            try:
                os.link(tmp, path)  # atomic create-if-absent with the full content in place
            except FileExistsError:
                return False
            if durable:
                self._fsync_dir(os.path.dirname(path), site)
            return True
        except OSError as exc:
            raise _os_error(exc, "write", key) from None
        finally:
            if tmp:
                _unlink_quiet(tmp)

    def delete(self, key: str, *, site: str = "delete") -> None:
        path = self._path(key)
        self._check_dirs(path)
        try:
            faults.hit(site)
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _os_error(exc, "delete", key) from None

    def sync_dir(self, prefix: str, *, site: str = "dir") -> None:
        """fsync a folder after deletes in it (gc)."""
        path = self._path(prefix.rstrip("/"))
        try:
            if os.path.isdir(path):
                self._fsync_dir(path, site)
        except OSError as exc:
            raise _os_error(exc, "sync", prefix) from None

    def delete_owned_temps(self, owner: str) -> int:
        """Delete the temp files a writer marked with ``owner`` (a save lock's name: its packs
        held aside), once that save is provably dead; returns how many."""
        n = 0
        for key in self.list(TMP_DIR + "/"):
            if owned_temp(key[len(TMP_DIR) + 1:], owner):
                self.delete(key, site="save.temp.delete")
                n += 1
        return n

    def temp_files(self) -> builtins.list[tuple[str, float]]:   # (list: the method above)
        """Leftover temp files from interrupted writes: (key, mtime)."""
        out = []
        for key in self.list(TMP_DIR + "/"):
            try:
                out.append((key, self.mtime(key)))
            except FileNotFoundError:
                pass
        return out


def _pieces(outs: "list[memoryview]", skip: int, end: int) -> "list[memoryview]":
    """The parts of ``outs`` (buffers filled one after the other) from byte ``skip`` to ``end``,
    at most IOV_MAX of them (preadv's limit: the loop around it reads the rest)."""
    parts: list[memoryview] = []
    pos = 0
    for o in outs:
        lo, hi = max(skip - pos, 0), min(len(o), end - pos)
        if hi > lo:
            parts.append(o[lo:hi])
            if len(parts) == _IOV_MAX:
                break
        pos += len(o)
        if pos >= end:
            break
    return parts


_IOV_MAX = 1024


def _kind(mode: int) -> str:
    kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket",
             stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}
    return kinds.get(stat.S_IFMT(mode), f"file type {stat.S_IFMT(mode):o}")

