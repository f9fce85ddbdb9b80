"""Holds: versions that gc keeps for as long as the process holding them lives.

A hold is a lock-like file ``locks/hold-<host>-<pid>-<8 hex>`` whose body is a lock body (spec
§13) plus ``versions``, the ids it keeps.  It is judged exactly like a save lock: provably dead
holder (same host, pid namespace and boot; pid gone or reused) -> ignored, and deleted by the
next gc; holder that cannot be judged -> kept until the 6-hour lease runs out, which the holder
renews while it lives.  So a training run's divergence guard keeps the version it rolled back to
while it runs, and a killed run leaves nothing that pins a version forever (a tag would: and
``keep_tags=False`` retention would delete it).

A hold is written under the refs lock, where gc re-reads what it keeps before deleting manifests:
a hold written before gc takes that lock keeps its versions; one written after finds a manifest
gc removed and drops it (:meth:`Hold.set` returns what it really holds).

Example::

    hold = Hold(core.store)
    assert hold.set([vid]) == [vid]     # gc keeps vid from now on
    hold.release()
"""

from __future__ import annotations

import os
import secrets
from typing import Iterable

from ...format.ids import ID_HEX_LEN, is_hex_prefix
from ...store.base import Store
from .. import locks
from ..layout import MANIFESTS

HOLDS = locks.LOCKS + "hold-"
#: versions one hold file keeps (33 bytes each: the body stays far below the 4096-byte lock limit)
MAX_HELD = 32


class Hold:
    """The versions this process asks gc to keep; :meth:`set` replaces them, :meth:`release`
    (or the process's death) ends the hold."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.key = f"{HOLDS}{locks.HOST}-{os.getpid()}-{secrets.token_hex(4)}"
        self.versions: list[str] = []
        self._body = b""
        self._renewer: locks._Renewer | None = None

    def set(self, versions: Iterable[str]) -> list[str]:
        """Hold exactly ``versions`` (the first MAX_HELD; ``[]`` releases); returns the ones held,
        which are those whose manifest still exists once the hold is durable."""
        wanted = list(dict.fromkeys(versions))[:MAX_HELD]
        if wanted == self.versions:
            return list(wanted)
        with locks.refs_lock(self.store):
            self._write(wanted)
            present = [v for v in wanted if self.store.exists(MANIFESTS + v)]
            if present != wanted:
                self._write(present)
        return list(present)

    def _write(self, versions: list[str]) -> None:
        self._stop_renewing()
        if not versions:
            self._delete()
        else:
            self._body = locks._body("hold", secrets.token_hex(8), versions=versions)
            self.store.put_atomic(self.key, self._body, site="lock.hold")
            self._renewer = locks._Renewer(self.store, self.key, self._body, "hold")
        self.versions = versions

    def _stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None

    def _delete(self) -> None:
        if self._body:
            locks._release(self.store, self.key, self._body, "hold")
            self._body = b""

    def release(self) -> None:
        """Stop holding anything (idempotent)."""
        self._stop_renewing()
        self._delete()
        self.versions = []


def _held_ids(info: dict | None) -> list[str]:
    """The version ids a hold body names; a malformed list holds nothing."""
    vids = info.get("versions") if isinstance(info, dict) else None
    if not isinstance(vids, list) or len(vids) > MAX_HELD:
        return []
    if not all(isinstance(v, str) and len(v) == ID_HEX_LEN and is_hex_prefix(v) for v in vids):
        return []
    return vids


def held(store: Store) -> dict[str, str]:
    """Version id -> who holds it, over every live hold (stale ones are skipped, not deleted:
    a dry-run gc reads this too)."""
    out: dict[str, str] = {}
    for key in store.list(locks.LOCKS):
        if not key.startswith(HOLDS):
            continue
        info = locks._holder(store, key)
        if info is None or locks.is_stale(store, key, info):
            continue
        for vid in _held_ids(info):
            out.setdefault(vid, f"held by {locks.describe(info)}")
    return out


def break_stale(store: Store) -> int:
    """Delete the holds whose holder is gone (gc, under its lock); returns how many."""
    n = 0
    for key in store.list(locks.LOCKS):
        if key.startswith(HOLDS) and not key.endswith(".break"):
            info = locks._holder(store, key)
            if info is not None and locks.is_stale(store, key, info):
                store.delete(key, site="lock.hold.break")
                n += 1
    return n
