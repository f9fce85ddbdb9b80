"""A persistent child process that stores the versions of background saves.

Why a process: a background save in a thread of the training process hashes, encodes and writes
in C with the GIL released, but the Python between those calls still takes the GIL from the
training loop, and the save's allocations fault pages in the training process's address space.
The child has its own GIL and address space, and a save it has received commits even if the
training process is killed meanwhile.  It is an option, not the default: on the 2-vCPU project
machine it cost a MiniLM fine-tune no less than the thread (bench/ASYNC.md), because what the loop
loses there is memory bandwidth, which a process shares too.

How the bytes get there: the parent snapshots tensors into a :class:`SharedSegment` (a
``memfd``, mapped in both processes, reused by the next save), then sends the child the blobs as
(offset, length) pairs into it.  The child writes packs, index, manifest and ref exactly as an
in-process save would (``saver.write_version``), keeping its own delta cache, and replies with the
committed manifest.  Nothing is copied between the processes but that small message.

Protocol on a private AF_UNIX socket pair: each message is an 8-byte little-endian length and a
pickle.  Pickle is safe here: both ends are this module, in a process and the child it started;
repository data never goes through it.  A segment's file descriptor travels with SCM_RIGHTS.

Lifetime: the child exits when its socket closes (the parent exited, or was killed: a save it had
already received is finished first, so a killed training job's last background save still lands).
It runs in its own session and ignores SIGINT, so Ctrl-C in the terminal (SIGINT to the whole
foreground process group) interrupts the training process but not a save the child holds.
If the child dies, the save in flight fails with :class:`EncoderProcessError` and the next save
starts a new child.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...errors import DeltackptError, NotARepositoryError
from ...format.manifest import TensorEntry
from ..repository import Repository
from . import saver
from .session import WriteSession

_LEN = struct.Struct("<Q")
MAX_OPEN_REPOS = 4   # repositories the child keeps open (each with its delta cache), least recently used dropped


class EncoderProcessError(DeltackptError, RuntimeError):
    """The encoder process died, or could not be started, during a background save."""


def supported() -> bool:
    """Whether this platform can share staging memory with a child process (Linux memfd)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


class SharedSegment:
    """Staging memory both processes map: anonymous (``memfd``), so nothing is left behind in
    /dev/shm when a process is killed; freed when both have closed it."""

    _next_id = 0
    tensor: Any
    """A torch.Tensor viewing ``map``: set by :func:`deltackpt.snapshot.staging.new_segment` (this
    layer imports no torch)."""

    def __init__(self, size: int) -> None:
        self.size = max(size, mmap.PAGESIZE)
        self.fd = os.memfd_create("deltackpt-staging", getattr(os, "MFD_CLOEXEC", 0))
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        SharedSegment._next_id += 1
        self.id = SharedSegment._next_id
        self.sent_to: int | None = None   # pid of the child that has it mapped

    def offset_of(self, view: memoryview) -> int:
        """Where ``view`` (a slice of this segment's memory) starts in it; -1 if it is elsewhere."""
        if not view.nbytes:
            return -1
        off = _address(view) - _address(self.map)
        return off if 0 <= off and off + view.nbytes <= self.size else -1

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass  # a tensor still views it: the mapping goes when that tensor does
        os.close(self.fd)


def _address(buffer: Any) -> int:
    """The address of a buffer's first byte (numpy reads it without keeping an export alive)."""
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


def _send(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    head = _LEN.pack(len(data))
    if fds:
        socket.send_fds(sock, [head], fds)
    else:
        sock.sendall(head)
    sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return bytes(buf)


def _recv(sock: socket.socket, with_fds: bool = False) -> tuple[Any, list[int]] | None:
    head: bytes | None
    if with_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _LEN.size, 4)
        if not head:
            return None
        if len(head) < _LEN.size:
            rest = _recv_exact(sock, _LEN.size - len(head))
            if rest is None:
                return None
            head += rest
    else:
        head, fds = _recv_exact(sock, _LEN.size), []
        if head is None:
            return None
    data = _recv_exact(sock, _LEN.unpack(head)[0])
    if data is None:
        return None
    return pickle.loads(data), list(fds)


@dataclass
class _Job:
    location: str
    settings: dict
    segment: int
    blobs: list            # BlobInput with data = (offset, length) into the segment
    tensors: list[TensorEntry]
    tree: Any
    kwargs: dict


class EncoderProcess:
    """The parent's handle on one child.  :meth:`write_version` is the process twin of
    :func:`deltackpt.repo.write.saver.write_version`.

    Example::

        enc = EncoderProcess()
        seg = SharedSegment(nbytes)          # fill seg.map, point each BlobInput.data into it
        vid, stats = enc.write_version(repo, blobs, entries, tree, segment=seg, step=10)
    """

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        try:
            # its own session: Ctrl-C (and any signal sent to the training job's process group) stops
            # the training process, never a save this child has received; the child exits when the
            # parent's end of the socket closes, however the parent went
            self.proc = subprocess.Popen([sys.executable, "-m", "deltackpt.repo.write.encoder_process", str(child.fileno())],
                                         pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        except OSError as exc:
            parent.close()
            raise EncoderProcessError(f"could not start the encoder process: {exc}") from exc
        finally:
            child.close()
        self.sock = parent
        self.lock = threading.Lock()
        self.lost = False   # a save found the connection gone: the next one starts a new process

    @property
    def alive(self) -> bool:
        # a save that lost the connection marks it: a child killed a moment ago has closed its
        # socket before the kernel lets it be reaped, so poll() alone can still say "running"
        return not self.lost and self.proc.poll() is None

    def write_version(self, session: WriteSession, blobs: list, tensors: list[TensorEntry], tree: Any, *,
                      segment: SharedSegment, workers: int | None = None, **kwargs: Any) -> tuple[str, saver.SaveStats]:
        """Store a version whose blob bytes all lie in ``segment``; returns (version id, stats)."""
        spans = []
        for b in blobs:
            view = memoryview(b.data).cast("B")
            off = segment.offset_of(view)
            if off < 0 and view.nbytes:
                raise EncoderProcessError(f"blob {b.key!r} is not in the staging segment")
            spans.append(replace(b, data=(max(off, 0), view.nbytes)))
        repo = session.repo
        repo.require_present()   # before the child opens it: a vanished repository is not created again
        w = session.settings
        settings = {"repo_id": repo.config.repo_id, "chunk_bytes": w.chunk_bytes, "keyframe_interval": w.keyframe_interval,
                    "delta_base": w.delta_base, "level": w.level, "delta_cache_bytes": session.delta_cache.fixed,
                    "workers": workers, "deltify_lag": session.deltify_lag, "deltify": session.deltify}
        job = _Job(repo.location, settings, segment.id, spans, tensors, tree, kwargs)
        with self.lock:
            try:
                if segment.sent_to != self.proc.pid:
                    _send(self.sock, ("segment", segment.id, segment.size), [segment.fd])
                    segment.sent_to = self.proc.pid
                _send(self.sock, ("save", job))
                reply = _recv(self.sock)
            except OSError:
                reply = None
        if reply is None:
            self.lost = True
            code = self.proc.poll()
            raise EncoderProcessError(
                f"the encoder process (pid {self.proc.pid}) died during the save of step {kwargs.get('step')} "
                f"to {repo.location} (exit status {code}); that version may or may not have been committed")
        (status, payload), _fds = reply
        if status == "error":
            raise payload
        vid, stats = payload
        repo.index.refresh()
        return vid, stats

    def _tell(self, *message: Any) -> None:
        """Send a message that needs no reply; a dead child needs none either."""
        if self.alive:
            with self.lock:
                try:
                    _send(self.sock, message)
                except OSError:
                    pass

    def forget(self, segment: SharedSegment) -> None:
        """Tell the child to unmap a segment the parent is dropping."""
        if segment.sent_to == self.proc.pid:
            self._tell("drop", segment.id)

    def close_repo(self, location: str) -> None:
        """Drop the child's handle (and delta cache) of the repository at ``location``."""
        self._tell("close", location)

    def close(self, timeout: float = 60.0) -> None:
        """Close the socket; the child finishes what it received and exits."""
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# the child ---------------------------------------------------------------------------------------

def _serve(sock: socket.socket) -> None:
    repos: dict[tuple[str, str], WriteSession] = {}
    segments: dict[int, mmap.mmap] = {}
    while True:
        msg = _recv(sock, with_fds=True)
        if msg is None:
            return
        (kind, *args), fds = msg
        if kind == "segment":
            seg_id, size = args
            segments[seg_id] = mmap.mmap(fds[0], size)
            os.close(fds[0])
        elif kind == "drop":
            m = segments.pop(args[0], None)
            try:
                if m is not None:
                    m.close()
            except BufferError:
                pass  # a view of it is still alive (a failed save's traceback): unmapped with it
        elif kind == "close":
            for key in [k for k in repos if k[0] == args[0]]:
                repos.pop(key).close()
        elif kind == "save":
            result: tuple[str, object]
            try:
                result = ("ok", _save(repos, segments, args[0]))
            except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
                result = ("error", _portable(exc))
            _send(sock, result)


def _save(repos: dict[tuple[str, str], WriteSession], segments: dict[int, mmap.mmap],
          job: _Job) -> tuple[str, saver.SaveStats]:
    s = job.settings
    key = (job.location, s["repo_id"])   # a repository deleted and created again is another one
    session = repos.pop(key, None)
    if session is None:
        repo = Repository(job.location)   # the parent's handle proved it exists; never create it here
        if repo.config.repo_id != s["repo_id"]:
            raise NotARepositoryError(f"{job.location}: another repository replaced the one this handle opened "
                                      "(its repo_id differs); nothing was written: open it again")
        session = WriteSession(repo)
    repos[key] = session                  # most recently used last
    while len(repos) > MAX_OPEN_REPOS:
        repos.pop(next(iter(repos))).close()
    # the parent's handle's settings, which may change between its saves
    session.settings.chunk_bytes = s["chunk_bytes"]
    session.settings.keyframe_interval = s["keyframe_interval"]
    session.settings.delta_base = s["delta_base"]
    session.settings.level = s["level"]
    session.delta_cache.fixed = s["delta_cache_bytes"]   # None: a tenth of each state (fit() per save)
    if s["delta_cache_bytes"] is not None:
        session.delta_cache.max_bytes = s["delta_cache_bytes"]
    session.deltify_lag = s["deltify_lag"]
    session.deltify = s["deltify"]
    mem = memoryview(segments[job.segment])
    blobs = [replace(b, data=mem[off:off + n]) for b, (off, n) in ((b, b.data) for b in job.blobs)]
    return saver.write_version(session, blobs, job.tensors, job.tree, workers=s["workers"], **job.kwargs)


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
        return DeltackptError(f"background save failed in the encoder process: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    # a SIGINT sent to this pid alone would otherwise abort a received save half-way (its packs
    # aborted, the version lost); the parent's socket closing is what ends this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(socket.socket(fileno=int(sys.argv[1])))
