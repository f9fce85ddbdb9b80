"""Live rollback: turn the chunk a destination already holds into the chunk asked for, reading
only the deltas between them.

A restore into a live model hashes the destination's bytes at each chunk's position (xxh3-128,
the chunk id).  Equal to the chunk asked for: nothing is read or written.  Otherwise the index
(no object read yet) says whether the live chunk is one end of a short path of stored deltas:

- forward: the live chunk is a link of the target's delta chain (newest-whole repositories roll
  back this way; forward-chained ones roll forward): the deltas above it apply in place;
- inverse: the live chunk is stored as an invertible delta (xor, sub) whose base is, after some
  steps, a link of the target's chain (forward-chained repositories roll back this way): those
  deltas are undone in place, then the target's deltas above the meeting link apply.

The path is taken only when its stored bytes are fewer than a normal read's, and every link is
hash-checked as it lands.  Only the destination's own position is used as a base, so writing
position i never destroys a base another position needs.  A corrupt link of the target's chain
raises CorruptObjectError, as a normal read would; a link of an undone delta belongs to another
version, so its failure falls back to a normal read (which overwrites the whole chunk).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from ...codecs import registry
from ...errors import CorruptObjectError, DeltackptError
from ...format import objects
from ...format.ids import digest
from ...format.limits import MAX_CHAIN_DEPTH
from ...format.pack import PackEntry
from .copies import PackGone


class ObjectSource(Protocol):
    """What live rollback reads through (a repository's :class:`~.reader.ChunkReader`, which calls
    :func:`rehydrate`; so this module never imports the reader)."""

    def entries_for(self, cid: bytes) -> list[tuple[str, PackEntry]]: ...

    def read_object(self, pack_id: str, e: PackEntry) -> objects.EncodedObject: ...

Link = tuple[bytes, str, PackEntry]   # the chunk id, the pack holding the copy used, its entry


@dataclass
class LiveStats:
    """How live restores in this process went, in chunks (tests and benchmarks read it)."""

    unchanged: int = 0     # the destination already held the chunk
    forward: int = 0       # deltas above the live chunk applied
    inverse: int = 0       # the live chunk's own deltas undone (then forward ones, if any)
    full: int = 0          # no shorter path (or it failed): a normal read

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.unchanged = self.forward = self.inverse = self.full = 0

    def count(self, kind: str) -> None:
        with self._lock:
            setattr(self, kind, getattr(self, kind) + 1)


stats = LiveStats()


@dataclass(frozen=True)
class Path:
    undo: list[Link]      # the live chunk's deltas, newest first, each undone in turn
    apply: list[Link]     # the target's deltas above the meeting link, lowest first
    cost: int             # stored bytes read


def _target_chain(repo: ObjectSource, cid: bytes, size: int) -> tuple[list[Link], int] | None:
    """The target's chain through best copies, target first, and a normal read's stored bytes
    (the whole chain); None when a link is unindexed, of another size, or the chain loops."""
    chain: list[Link] = []
    cost = 0
    cur: bytes | None = cid
    while cur is not None:
        copies = repo.entries_for(cur)
        if not copies or len(chain) > MAX_CHAIN_DEPTH or any(c == cur for c, _, _ in chain):
            return None
        pid, e = copies[0]
        if e.raw_len != size:
            return None
        chain.append((cur, pid, e))
        cost += e.length
        cur = e.base
    return chain, cost


def plan(repo: ObjectSource, cid: bytes, live: bytes, size: int) -> Path | None:
    """The cheapest path from the live chunk to ``cid`` that beats a normal read, or None."""
    found = _target_chain(repo, cid, size)
    if found is None:
        return None
    chain, full = found
    where = {c: i for i, (c, _, _) in enumerate(chain)}
    if live in where:
        k = where[live]
        up = chain[:k][::-1]
        cost = sum(e.length for _, _, e in up)
        return Path([], up, cost) if cost < full else None
    undo: list[Link] = []
    cost, cur = 0, live
    while cur not in where:
        if len(undo) > MAX_CHAIN_DEPTH or cost >= full:
            return None
        step = next(((pid, e) for pid, e in repo.entries_for(cur)
                     if e.base is not None and e.raw_len == size and _invertible(e.encoding)), None)
        if step is None or any(c == step[1].base for c, _, _ in undo):
            return None
        undo.append((cur, step[0], step[1]))
        cost += step[1].length
        cur = step[1].base  # type: ignore[assignment]  # (a delta: its base is set, checked in undo above)
    up = chain[:where[cur]][::-1]
    cost += sum(e.length for _, _, e in up)
    return Path(undo, up, cost) if cost < full else None


def _invertible(encoding: int) -> bool:
    try:
        return registry.get(encoding).invertible
    except CorruptObjectError:  # an unknown id: a normal read reports it, if it matters
        return False


def _undo(repo: ObjectSource, path: Path, dest: memoryview) -> bool:
    """Undo the live chunk's deltas in place; False (the destination then holds anything) when
    one cannot be read or does not land on its base."""
    for c, pid, e in path.undo:
        try:
            obj = repo.read_object(pid, e)
            registry.get(obj.encoding).unapply_into(dest, obj.params, obj.payload)
        except (DeltackptError, ValueError, TypeError, IndexError, OverflowError, MemoryError):
            return False
        if digest(dest) != e.base:
            return False
    return True


def _apply(repo: ObjectSource, path: Path, dest: memoryview) -> bool:
    """Apply the target's deltas above the meeting link in place, each hash-checked; False when a
    pack is gone (a normal read looks again), CorruptObjectError when a link is corrupt."""
    for c, pid, e in path.apply:
        what = f"chunk {c.hex()} in pack {pid}"
        try:
            obj = repo.read_object(pid, e)
            registry.get(obj.encoding).apply_into(dest, obj.params, obj.payload)
        except PackGone:
            return False
        except CorruptObjectError as exc:
            raise CorruptObjectError(f"{what}: {exc}") from None
        except (ValueError, TypeError, IndexError, OverflowError, MemoryError) as exc:
            raise CorruptObjectError(f"{what}: undecodable ({type(exc).__name__}: {exc})") from None
        if digest(dest) != c:
            raise CorruptObjectError(f"{what}: decoded bytes do not match the chunk id (data corrupted)")
    return True


def rehydrate(repo: ObjectSource, cid: bytes, dest: memoryview) -> bool:
    """Make ``dest`` hold chunk ``cid`` from what it holds now; False when a normal read must."""
    live = digest(dest)
    if live == cid:
        stats.count("unchanged")
        return True
    path = plan(repo, cid, live, len(dest)) if repo.entries_for(live) else None
    if path is None:
        stats.count("full")
        return False
    if not _undo(repo, path, dest) or not _apply(repo, path, dest):
        stats.count("full")
        return False
    if path.undo:
        stats.count("inverse")
    else:
        stats.count("forward")
    return True
