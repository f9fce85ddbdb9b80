"""A LocalStore whose writes go through a model of the kernel page cache, to simulate power loss.

The repository under test talks to it like to any store; underneath, every step of LocalStore's
write protocol (temp file write, file fsync, rename or link into place, directory fsync, mkdir,
unlink) is applied to the real directory *and* recorded.  Data is durable once its file was
fsynced; a directory entry (a rename, link, unlink or mkdir) is durable once its directory was
fsynced.  ``crash(rng)`` then rewrites the directory as a power cut could leave it: each file
write not yet fsynced is kept, dropped (empty) or garbled; each directory change not yet followed
by a directory fsync is kept or reverted (the old entry comes back, the new one vanishes).

``cut_at=N`` makes the Nth recorded step raise :class:`PowerCut` (and every later step too, so no
``finally`` block can touch the disk after the power went out).
"""

from __future__ import annotations

import os
import random
import shutil

from deltackpt.store.base import AtomicWriter
from deltackpt.store.local import TMP_DIR, LocalStore


class PowerCut(BaseException):
    """The power went out at this step (a BaseException: nothing may catch and carry on)."""


class _File:
    __slots__ = ("data", "synced")

    def __init__(self, data: bytes, synced: bytes | None) -> None:
        self.data = data
        self.synced = synced


DIR = "<dir>"


def _content_after_cut(node: _File, rng: random.Random, revert_only: tuple[str, ...] | None,
                       stats: dict[str, int]) -> bytes:
    """A file's bytes after the cut: as written when fsynced; otherwise kept, dropped or garbled
    (always kept with ``revert_only``)."""
    if node.synced is not None and node.synced == node.data:
        return node.data
    how = "keep" if revert_only is not None else rng.choice(("keep", "drop", "garble"))
    if how == "keep":
        stats["kept_unsynced"] += 1
        return node.data
    if how == "drop":
        stats["dropped"] += 1
        return b""
    stats["garbled"] += 1
    cut = rng.randrange(len(node.data) + 1)
    junk = bytearray(node.data[:cut])
    for _ in range(min(4, len(junk))):
        junk[rng.randrange(len(junk))] ^= 1 << rng.randrange(8)
    return bytes(junk)


class _Writer(AtomicWriter):
    def __init__(self, store: "PageCacheStore", site: str) -> None:
        super().__init__(store, site)

    def commit(self, key: str) -> None:
        self._store.put_atomic(key, b"".join(self._parts), site=self._site)
        self._parts = []


class PageCacheStore(LocalStore):
    stages_writes = False   # every write goes through this model of the page cache, never stages

    def __init__(self, root: str, cut_at: int | None = None) -> None:
        super().__init__(root)
        os.makedirs(self.root, exist_ok=True)
        self.cut_at = cut_at
        self.steps = 0
        self.dead = False
        self._snapshot()

    # the model -------------------------------------------------------------------------
    def _snapshot(self) -> None:
        """Everything now on disk is durable."""
        self.live: dict[str, object] = {}
        self.durable: dict[str, dict[str, object]] = {self.root: {}}
        for dirpath, dirnames, filenames in os.walk(self.root):
            entries = self.durable.setdefault(dirpath, {})
            for d in dirnames:
                p = os.path.join(dirpath, d)
                self.live[p] = DIR
                entries[d] = DIR
                self.durable.setdefault(p, {})
            for f in filenames:
                p = os.path.join(dirpath, f)
                with open(p, "rb") as fh:
                    data = fh.read()
                node = _File(data, data)
                self.live[p] = node
                entries[f] = node

    def _step(self) -> None:
        self.steps += 1
        if self.dead or (self.cut_at is not None and self.steps >= self.cut_at):
            self.dead = True
            raise PowerCut(f"power cut at step {self.steps}")

    # LocalStore's write protocol, step by step -------------------------------------------
    def _mkdir(self, path: str) -> None:
        self._step()
        os.mkdir(path)
        self.live[path] = DIR
        self.durable.setdefault(path, {})

    def _fsync_dir(self, path: str, site: str) -> None:
        self._step()
        self.durable[path] = {os.path.basename(p): n for p, n in self.live.items() if os.path.dirname(p) == path}

    def _tmp(self, data: bytes, key: str, durable: bool = True) -> str:
        tmp_dir = os.path.join(self.root, TMP_DIR)
        self._makedirs(tmp_dir)
        self._step()
        tmp = os.path.join(tmp_dir, f"{key.replace('/', '_')}.{self.steps}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        self.live[tmp] = _File(bytes(data), None)
        if durable:
            self._step()
            self.live[tmp].synced = self.live[tmp].data  # fsync
        return tmp

    def _unlink(self, path: str) -> None:
        self._step()
        os.unlink(path)
        self.live.pop(path, None)

    def writer(self, *, site: str = "object", owner: str | None = None) -> AtomicWriter:  # type: ignore[override]
        return _Writer(self, site)

    def put_atomic(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> None:
        path = self._path(key)
        self._makedirs(os.path.dirname(path))
        tmp = self._tmp(data, key, durable)
        self._step()
        os.replace(tmp, path)
        self.live[path] = self.live.pop(tmp)
        if durable:
            self._fsync_dir(os.path.dirname(path), site)

    def put_if_absent(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> bool:
        path = self._path(key)
        self._makedirs(os.path.dirname(path))
        if os.path.lexists(path):
            return False
        tmp = self._tmp(data, key, durable)
        self._step()
        os.link(tmp, path)
        self.live[path] = self.live[tmp]
        if durable:
            self._fsync_dir(os.path.dirname(path), site)
        self._unlink(tmp)
        return True

    def delete(self, key: str, *, site: str = "delete") -> None:
        path = self._path(key)
        if os.path.lexists(path):
            self._unlink(path)

    def sync_dir(self, prefix: str, *, site: str = "dir") -> None:
        path = self._path(prefix.rstrip("/"))
        if os.path.isdir(path):
            self._fsync_dir(path, site)

    # the power cut -----------------------------------------------------------------------
    def crash(self, rng: random.Random, revert_only: tuple[str, ...] | None = None) -> dict[str, int]:
        """Rewrite the directory as the power cut left it; returns counts of what was lost or reverted.
        ``revert_only``: instead of choosing at random, revert the unsynced directory changes in
        these folders (relative to the root) and keep all others (a legal, adversarial order)."""
        stats = {"dropped": 0, "garbled": 0, "reverted": 0, "kept_unsynced": 0}
        children: dict[str, dict[str, object]] = {}
        for p, n in self.live.items():
            children.setdefault(os.path.dirname(p), {})[os.path.basename(p)] = n
        out: dict[str, object] = {}
        self._survivors(self.root, children, out, rng, revert_only, stats)
        shutil.rmtree(self.root)
        os.makedirs(self.root)
        for p in sorted(out):
            if out[p] is DIR:
                os.makedirs(p, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(out[p])
        self.dead = False
        self.cut_at = None
        self._snapshot()
        return stats

    def _survivors(self, dirpath: str, children: dict[str, dict[str, object]], out: dict[str, object],
                   rng: random.Random, revert_only: tuple[str, ...] | None, stats: dict[str, int]) -> None:
        """Fill ``out`` with what is under ``dirpath`` after the cut (path -> bytes, or DIR)."""
        live = children.get(dirpath, {})
        dur = self.durable.get(dirpath, {})
        for name in sorted(set(live) | set(dur)):
            a, b = live.get(name), dur.get(name)
            node = a
            if a is not b:
                if revert_only is None:
                    node = rng.choice((a, b))
                else:
                    node = b if os.path.relpath(dirpath, self.root) in revert_only else a
                stats["reverted"] += node is b
            if node is None:
                continue
            p = os.path.join(dirpath, name)
            if node is DIR:
                out[p] = DIR
                self._survivors(p, children, out, rng, revert_only, stats)
            else:
                out[p] = _content_after_cut(node, rng, revert_only, stats)
