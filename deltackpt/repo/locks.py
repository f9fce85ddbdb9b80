"""Locks in the store: shared locks for saves, an exclusive lock for gc's delete phase, a mutex
for ref updates.  A lock is a small object created with put_if_absent holding host, pid and time;
it is stale when its process is gone (same host) or it is older than ``STALE_SECONDS``.
Protocol: spec/FORMAT.md, "Locks"."""

from __future__ import annotations

import os
import secrets
import socket
import time
from contextlib import contextmanager
from typing import Iterator

from ..errors import ObjectNotFoundError, RepositoryLockedError
from ..format import msgpack_io
from ..store.base import Store

LOCKS = "locks/"
GC_LOCK = "locks/gc"
REFS_LOCK = "locks/refs"
STALE_SECONDS = 6 * 3600.0
HOST = socket.gethostname()


def _body(kind: str, token: str = "") -> bytes:
    return msgpack_io.pack({"host": HOST, "pid": os.getpid(), "time": time.time(), "kind": kind, "token": token})


def _holder(store: Store, key: str) -> dict | None:
    try:
        data = store.get(key, 0, 4097)  # a lock body is at most 4096 bytes: never read a huge file whole
    except (ObjectNotFoundError, FileNotFoundError):
        return None
    try:
        info = msgpack_io.unpack(data, what=f"lock {key}", max_bytes=4096)
        return info if isinstance(info, dict) else {}
    except Exception:
        return {}  # a torn lock file: judged by age only


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (killed child not yet reaped) still answers kill(0): look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def is_stale(store: Store, key: str, info: dict | None) -> bool:
    if info is None:
        return True
    if info.get("host") == HOST and isinstance(info.get("pid"), int) and info["pid"] != os.getpid():
        if not _pid_alive(info["pid"]):
            return True
    try:
        age = time.time() - store.mtime(key)
    except FileNotFoundError:
        return True
    return age > STALE_SECONDS


def describe(info: dict | None) -> str:
    if not info:
        return "an unknown process"
    return f"pid {info.get('pid')} on {info.get('host')} since {time.ctime(info.get('time', 0))}"


def _break(store: Store, key: str, kind: str, info: dict) -> None:
    """Delete the stale lock ``key`` whose body was ``info``, but never a live lock that replaced it.

    Two waiters can judge the same dead holder stale; deleting blindly, the slower one deletes the
    lock the faster one just took (however long after), and both go on holding it.  Breakers
    serialize on a ``.break`` guard and delete only when the lock still holds the body (token
    included) they judged stale.
    """
    guard = key + ".break"
    if not store.put_if_absent(guard, _body(kind + ".break", secrets.token_hex(8)), site=f"lock.{kind}.guard"):
        ginfo = _holder(store, guard)
        if ginfo is not None and is_stale(store, guard, ginfo):  # a breaker died mid-break
            store.delete(guard, site=f"lock.{kind}.guard.break")
        return
    try:
        if _holder(store, key) == info:
            store.delete(key, site=f"lock.{kind}.break")
    finally:
        store.delete(guard, site=f"lock.{kind}.guard.release")


def _acquire(store: Store, key: str, kind: str, timeout: float) -> bytes:
    """Take the lock ``key``; returns the body written, which :func:`_release` checks."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        body = _body(kind, secrets.token_hex(8))
        if store.put_if_absent(key, body, site=f"lock.{kind}"):
            return body
        info = _holder(store, key)
        if info is None:
            continue  # released since our attempt: try again (deleting now could hit a new holder's lock)
        if is_stale(store, key, info):
            _break(store, key, kind, info)
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


def live_save_locks(store: Store) -> list[tuple[str, dict | None]]:
    out = []
    for key in store.list(LOCKS):
        if key.startswith(LOCKS + "save-"):
            info = _holder(store, key)
            if is_stale(store, key, info):
                store.delete(key, site="lock.save.break")
            else:
                out.append((key, info))
    return out


@contextmanager
def refs_lock(store: Store, timeout: float = 60.0) -> Iterator[None]:
    body = _acquire(store, REFS_LOCK, "refs", timeout)
    try:
        yield
    finally:
        _release(store, REFS_LOCK, body, "refs")


@contextmanager
def save_lock(store: Store, timeout: float = 600.0) -> Iterator[None]:
    """Shared: many saves at once, none while gc deletes."""
    key = f"{LOCKS}save-{HOST}-{os.getpid()}-{secrets.token_hex(4)}"
    deadline = time.monotonic() + timeout
    while True:
        store.put_atomic(key, _body("save"), site="lock.save")
        gc_info = _holder(store, GC_LOCK)
        if gc_info is None or is_stale(store, GC_LOCK, gc_info):
            break
        store.delete(key, site="lock.save.backoff")
        if time.monotonic() > deadline:
            raise RepositoryLockedError(f"gc holds the repository ({describe(gc_info)})")
        time.sleep(0.05)
    try:
        yield
    finally:
        store.delete(key, site="lock.save.release")


@contextmanager
def gc_lock(store: Store, timeout: float = 600.0) -> Iterator[None]:
    """Exclusive: waits for running saves to finish, keeps new ones out."""
    body = _acquire(store, GC_LOCK, "gc", timeout)
    try:
        deadline = time.monotonic() + timeout
        while True:
            saves = live_save_locks(store)
            if not saves:
                break
            if time.monotonic() > deadline:
                raise RepositoryLockedError(f"a save is running ({describe(saves[0][1])}); gc gave up waiting")
            time.sleep(0.05)
        yield
    finally:
        _release(store, GC_LOCK, body, "gc")
