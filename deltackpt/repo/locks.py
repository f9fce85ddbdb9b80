"""Locks in the store: shared locks for saves, an exclusive lock for gc's delete phase, a mutex
for ref updates.  A lock is a small object created with put_if_absent holding host, pid, time and
the holder's pid namespace, boot id and process start time; it is stale when its process is
provably gone (same host, same pid namespace, same boot) or, when that cannot be proven, once it
is older than the lease ``STALE_SECONDS``.  Protocol: spec/FORMAT.md, "Locks"."""

from __future__ import annotations

import errno
import os
import secrets
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from .. import threads
from ..errors import ObjectNotFoundError, RepositoryLockedError, StoreError
from ..format import msgpack_io
from ..store.base import Store
from .lock_holders import BOOT, HOST as HOST, describe as describe, holder_state, pid_namespace, start_time

LOCKS = "locks/"
GC_LOCK = "locks/gc"
REFS_LOCK = "locks/refs"
STALE_SECONDS = 6 * 3600.0
#: how often a save or gc refreshes its lock file, so that a holder nobody can prove alive (another
#: host or pid namespace) never outlives its lease while it runs; the lease is 12 renewals long
RENEW_SECONDS = STALE_SECONDS / 12
#: the locks gc may take with an empty body on a full disk (:func:`_put_lock`).  They are written
#: durably, so that after a power cut an empty one is always a full disk's.  Every other lock is
#: written without fsync (a lock matters only while its holder lives): an empty or unreadable one
#: is what a power cut left of an unsynced write, and its holder is gone.
MAY_BE_EMPTY = (GC_LOCK, REFS_LOCK)


def _body(kind: str, token: str = "", **extra: object) -> bytes:
    """A lock body naming this process; ``extra`` fields follow the common ones (a hold's versions)."""
    pid = os.getpid()
    return msgpack_io.pack({"host": HOST, "pid": pid, "time": time.time(), "kind": kind, "token": token,
                            "pidns": pid_namespace(), "boot": BOOT, "start": start_time(pid), **extra})


class Holder(dict):
    """A lock body as read: its fields, and the bytes they came from (``raw``).  Two reads are the
    same holder when their bytes are equal: comparing fields would call a body holding a NaN
    different from itself, and its lock could never be broken."""

    raw: bytes = b""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Holder):
            return self.raw == other.raw
        return dict.__eq__(self, other)

    __hash__ = None


def _holder(store: Store, key: str) -> Holder | None:
    try:
        data = store.get(key, 0, 4097)  # a lock body is at most 4096 bytes: never read a huge file whole
    except (ObjectNotFoundError, FileNotFoundError):
        return None
    try:
        info = msgpack_io.unpack(data, what=f"lock {key}", max_bytes=4096)
    except Exception:
        info = None
    out = Holder(info if isinstance(info, dict) else {})  # torn or not a map: judged by age only
    out.raw = bytes(data)
    return out


def is_stale(store: Store, key: str, info: dict | None) -> bool:
    """May ``key`` (whose body was ``info``) be broken?  Gone, or its holder provably dead, or
    (holder not provably alive) older than the lease ``STALE_SECONDS``."""
    if info is None:
        return True
    if not info and key not in MAY_BE_EMPTY:
        return True   # no live holder's body is empty or torn (written whole, then linked)
    state = holder_state(info) if info else "unknown"
    if state == "dead":
        return True
    if state == "alive":
        return False  # a long save keeps its lock however old it is
    try:
        age = time.time() - store.mtime(key)
    except FileNotFoundError:
        return True
    return age > STALE_SECONDS


def _break(store: Store, key: str, kind: str, info: dict) -> None:
    """Delete the stale lock ``key`` whose body was ``info``, but never a live lock that replaced it.

    Two waiters can judge the same dead holder stale; deleting blindly, the slower one deletes the
    lock the faster one just took (however long after), and both go on holding it.  Breakers
    serialize on a ``.break`` guard and delete only when the lock still holds the body (token
    included) they judged stale.
    """
    guard = key + ".break"
    if not store.put_if_absent(guard, _body(kind + ".break", secrets.token_hex(8)), site=f"lock.{kind}.guard", durable=False):
        ginfo = _holder(store, guard)
        if ginfo is not None and is_stale(store, guard, ginfo):  # a breaker died mid-break
            store.delete(guard, site=f"lock.{kind}.guard.break")
        return
    try:
        if _holder(store, key) == info:
            store.delete(key, site=f"lock.{kind}.break")
    finally:
        store.delete(guard, site=f"lock.{kind}.guard.release")


def _put_lock(store: Store, key: str, body: bytes, kind: str, full_disk_ok: bool) -> tuple[bool, bytes]:
    try:
        return store.put_if_absent(key, body, site=f"lock.{kind}", durable=key in MAY_BE_EMPTY), body
    except StoreError as exc:
        if not full_disk_ok or exc.errno != errno.ENOSPC:
            raise
        landed = _holder(store, key)
        if landed is not None and landed.raw == body:
            return True, body  # it landed; only making its folder entry durable failed
    # a full disk: an empty file needs no data block.  It names no holder, so nobody can prove
    # it dead: if we die holding it, only its lease breaks it.  :func:`_restamp` fills it in.
    return store.put_if_absent(key, b"", site=f"lock.{kind}"), b""


def _acquire(store: Store, key: str, kind: str, timeout: float, full_disk_ok: bool = False) -> bytes:
    """Take the lock ``key``; returns the body written, which :func:`_release` checks.
    ``full_disk_ok``: on ENOSPC take it with an empty body (gc, which is what frees space)."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        taken, body = _put_lock(store, key, _body(kind, secrets.token_hex(8)), kind, full_disk_ok)
        if taken:
            return body
        info = _holder(store, key)
        if info is None:
            continue  # released since our attempt: try again (deleting now could hit a new holder's lock)
        if is_stale(store, key, info):
            _break(store, key, kind, info)
            if time.monotonic() > deadline:  # a stale lock that will not go (a delete that keeps failing)
                raise RepositoryLockedError(f"{kind} lock {key!r} is stale ({describe(info)}) but could not "
                                            "be broken")
            time.sleep(delay)
            continue
        if time.monotonic() > deadline:
            raise RepositoryLockedError(f"{kind} lock {key!r} is held by {describe(info)}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _release(store: Store, key: str, body: bytes, kind: str) -> None:
    """Delete our lock, but not one that replaced it: if ours was judged stale and broken while
    we held it, the lock there now is another process's."""
    try:
        if store.get(key, 0, len(body) + 1) != body:
            return
    except FileNotFoundError:
        return
    store.delete(key, site=f"lock.{kind}.release")


def live_save_locks(store: Store) -> list[tuple[str, Holder | None]]:
    out: list[tuple[str, Holder | None]] = []
    for key in store.list(LOCKS):
        if key.startswith(LOCKS + "save-"):
            info = _holder(store, key)
            if is_stale(store, key, info):
                if info and holder_state(info) == "dead":
                    _delete_temps_of(store, key)
                store.delete(key, site="lock.save.break")
            else:
                out.append((key, info))
    return out


def _delete_temps_of(store: Store, key: str) -> None:
    """Delete the temp files the save holding ``key`` wrote for itself (its packs held aside until
    published); only ever called once that holder is provably dead, so nobody else can use them."""
    delete_save_temps(store, key[len(LOCKS):])


def delete_save_temps(store: Store, owner: str) -> None:
    """Delete the temp files named after the save lock ``owner`` (:func:`save_lock` yields the
    name): by the next save once that save is provably dead, or by the save itself when it stops.
    Only stores that hold temp files aside (local ones) have any."""
    delete = getattr(store, "delete_owned_temps", None)
    if delete is not None:
        delete(owner)


def clear_dead_saves(store: Store, own: str) -> None:
    """What saves killed here left (spec/FORMAT.md §13): for each save lock whose holder is
    provably dead (same host, pid namespace and boot; gone, a zombie or a reused pid), delete the
    temp files named after it, then the lock.  Temp files first: a crash in between leaves the
    lock, and the next save does the rest.  Locks nobody can prove dead wait for gc and its grace
    period, as before.  Only stores that hold temp files aside (local ones) have anything to do."""
    if getattr(store, "delete_owned_temps", None) is None:
        return
    for key in store.list(LOCKS):
        if key == own or not key.startswith(LOCKS + "save-") or key.endswith(".break"):
            continue
        info = _holder(store, key)
        if info and holder_state(info) == "dead":
            _delete_temps_of(store, key)
            _break(store, key, "save", info)


def _restamp(store: Store, key: str, body: bytes, kind: str) -> bytes:
    """Give an empty lock (taken on a full disk) a full body once there is room; returns the body
    the lock now holds.  Best effort: still no room leaves it empty."""
    if body:
        return body
    new = _body(kind, secrets.token_hex(8))
    try:
        if store.get(key, 0, len(body) + 1) != body:
            return body  # no longer ours (broken after its lease): leave it alone
        store.put_atomic(key, new, site=f"lock.{kind}.restamp")
    except (StoreError, OSError):
        return body
    return new


@contextmanager
def refs_lock(store: Store, timeout: float = 60.0, *, full_disk_ok: bool = False) -> Iterator[None]:
    body = _acquire(store, REFS_LOCK, "refs", timeout, full_disk_ok)
    try:
        yield
    finally:
        _release(store, REFS_LOCK, body, "refs")


class _Renewer:
    """Rewrites a held lock with the same body every ``RENEW_SECONDS`` (a fresh mtime: the lease
    restarts) until stopped; never after :meth:`stop` returned, so a release cannot be undone.
    Its thread belongs to the lock's holder: :meth:`stop` joins it."""

    def __init__(self, store: Store, key: str, body: bytes, kind: str) -> None:
        self.store, self.key, self.body, self.kind = store, key, body, kind
        self._stopped = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"deltackpt-{kind}-lock")
        self._thread.start()

    def _run(self) -> None:
        threads.leave_signals_to_main()
        while not self._stopped.wait(RENEW_SECONDS):
            with self._mutex:
                if self._stopped.is_set():
                    return
                try:
                    # only our own lock: one broken after its lease (we were frozen) stays broken
                    if self.body and self.store.get(self.key, 0, len(self.body) + 1) == self.body:
                        self.store.put_atomic(self.key, self.body, site=f"lock.{self.kind}.renew",
                                              durable=self.key in MAY_BE_EMPTY)
                except (StoreError, OSError):
                    pass  # the next renewal may work: the lease is 12 renewals long

    def stop(self) -> None:
        with self._mutex:
            self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()   # it wakes at once from its wait and returns


class SaveLease:
    """A shared save lock held (its key in ``locks/``, renewed by a thread until released).

    Example::

        lease = acquire_save(store)
        try:
            ...   # write packs named after lease.name
        finally:
            lease.release()
    """

    def __init__(self, store: Store, key: str, renewer: _Renewer) -> None:
        self.store, self.key, self._renewer = store, key, renewer
        self._released = False

    @property
    def name(self) -> str:
        """The lock's name, which the save's temp files carry (:func:`clear_dead_saves`)."""
        return self.key[len(LOCKS):]

    def release(self) -> None:
        """Stop renewing (joining the renewer) and delete the lock; a second call does nothing."""
        if self._released:
            return
        self._released = True
        self._renewer.stop()
        try:
            self.store.delete(self.key, site="lock.save.release")
        except FileNotFoundError:
            pass  # broken as stale meanwhile: nothing of ours to remove


def acquire_save(store: Store, timeout: float = 600.0) -> SaveLease:
    """Take a shared save lock; :meth:`SaveLease.release` gives it back.  For holders whose save
    spans calls (a DCP save: every rank's write_data, then the coordinator's finish)."""
    key = f"{LOCKS}save-{HOST}-{os.getpid()}-{secrets.token_hex(4)}"
    deadline = time.monotonic() + timeout
    while True:
        body = _body("save")
        store.put_atomic(key, body, site="lock.save", durable=False)
        gc_info = _holder(store, GC_LOCK)
        if gc_info is None or is_stale(store, GC_LOCK, gc_info):
            lease = SaveLease(store, key, _Renewer(store, key, body, "save"))
            clear_dead_saves(store, key)
            return lease
        store.delete(key, site="lock.save.backoff")
        if time.monotonic() > deadline:
            raise RepositoryLockedError(f"gc holds the repository ({describe(gc_info)})")
        time.sleep(0.05)


@contextmanager
def save_lock(store: Store, timeout: float = 600.0) -> Iterator[str]:
    """Shared: many saves at once, none while gc deletes.  Yields the lock's name, which the
    save's temp files carry (:func:`clear_dead_saves`)."""
    lease = acquire_save(store, timeout)
    try:
        yield lease.name
    finally:
        lease.release()


@contextmanager
def gc_lock(store: Store, timeout: float = 600.0, *, full_disk_ok: bool = False) -> Iterator[Callable[[], None]]:
    """Exclusive: waits for running saves to finish, keeps new ones out.  Yields ``restamp``: with
    ``full_disk_ok`` the lock may have been taken empty on a full disk; call it once space is freed."""
    held = [_acquire(store, GC_LOCK, "gc", timeout, full_disk_ok)]
    renewer = _Renewer(store, GC_LOCK, held[0], "gc")

    def restamp() -> None:
        with renewer._mutex:
            held[0] = renewer.body = _restamp(store, GC_LOCK, held[0], "gc")

    try:
        deadline = time.monotonic() + timeout
        while True:
            saves = live_save_locks(store)
            if not saves:
                break
            if time.monotonic() > deadline:
                raise RepositoryLockedError(f"a save is running ({describe(saves[0][1])}); gc gave up waiting")
            time.sleep(0.05)
        yield restamp
    finally:
        renewer.stop()
        _release(store, GC_LOCK, held[0], "gc")
