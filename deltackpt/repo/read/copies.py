"""Which stored copy of a chunk to read.

A chunk id may be indexed several times: two saves raced, gc rebased a delta into a keyframe and
died before deleting the old index, or (format 2) a head keyframe and the reverse delta that
replaces it coexist until the keyframe's pack is dropped.  The ``depth`` an entry records is the
chain length when it was written; it goes stale when a keyframe further down is later re-stored as
a delta, and two copies can even name each other as bases (a value that comes back: A, B, A).
So the choice is computed, not read: a breadth-first walk from the keyframes over the "is a delta
against" edges gives every chunk its shortest real chain and the copy that achieves it.  Following
chosen copies strictly shortens the chain at every link, so it never loops.

Example::

    res = resolve(copies_by_chunk)                      # every pack usable
    pid, entry = res.best[cid]; res.depth[cid]          # the copy to read, links to a keyframe
    res = resolve(copies_by_chunk, usable=lambda pid: pid in packs_on_disk)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from ...errors import CorruptObjectError
from ...format.pack import PackEntry

Copy = tuple[str, PackEntry]  # (pack id, entry)


class PackGone(CorruptObjectError):
    """A pack named by the index is missing (gc repacked it, or it was lost): read another copy."""


@dataclass
class Resolution:
    best: dict[bytes, Copy] = field(default_factory=dict)
    depth: dict[bytes, int] = field(default_factory=dict)
    _children: dict[bytes, list[bytes]] | None = None
    _heights: dict[bytes, int] = field(default_factory=dict)

    def order(self, copies: list[Copy]) -> list[Copy]:
        """``copies`` of one chunk, the one giving the shortest chain first (ties by pack id and
        offset); copies whose base does not resolve come last."""
        inf = 1 << 30

        def rank(c: Copy) -> tuple[int, str, int]:
            base = c[1].base
            if base is None:
                return 0, *copy_key(c)
            d = self.depth.get(base)
            return (inf if d is None else d + 1), *copy_key(c)
        return sorted(copies, key=rank)

    def _kids(self) -> dict[bytes, list[bytes]]:
        if self._children is None:
            children: dict[bytes, list[bytes]] = {}  # built whole before publishing: threads share it
            for c, (_pid, e) in self.best.items():
                if e.base is not None:
                    children.setdefault(e.base, []).append(c)
            self._children = children
        return self._children

    def height_outside(self, cid: bytes, skip: Iterable[bytes]) -> int:
        """:meth:`height`, leaving out the chains that start with a chunk in ``skip`` (chunks
        about to be re-stored with ``cid``, which will no longer read through it)."""
        skip = skip if isinstance(skip, (set, frozenset)) else set(skip)
        return max((self.height(k) + 1 for k in self._kids().get(cid, ()) if k not in skip), default=0)

    def height(self, cid: bytes) -> int:
        """The longest chain of chosen deltas that leads to ``cid`` (0: no chunk decodes through it).
        Re-storing ``cid`` as a delta makes every such chain one link longer."""
        children = self._kids()
        if cid in self._heights:
            return self._heights[cid]
        # iterative post-order: chains may be up to MAX_CHAIN_DEPTH long
        stack = [(cid, False)]
        while stack:
            node, done = stack.pop()
            kids = children.get(node, ())
            if done:
                self._heights[node] = max((self._heights[k] + 1 for k in kids), default=0)
            elif node not in self._heights:
                stack.append((node, True))
                stack.extend((k, False) for k in kids if k not in self._heights)
        return self._heights[cid]


def copy_key(copy: Copy) -> tuple[str, int]:
    """How copies of equal real depth are ordered (spec §8): by pack id, then offset.  Neither the
    order of index files nor the order of keys inside them decides which copy is read."""
    return copy[0], copy[1].offset


def resolve(copies: Mapping[bytes, Iterable[Copy]], usable: Callable[[str], bool] | None = None,
            extra: Iterable[tuple[bytes, Copy]] = ()) -> Resolution:
    """Shortest real chain and chosen copy of every chunk whose chain ends in a keyframe, using only
    copies in packs ``usable`` accepts (every pack when None) plus ``extra`` copies.  Among equally
    short choices the smallest by (pack id, offset) wins, so the choice is stable."""
    res = Resolution()
    users: dict[bytes, list[tuple[bytes, Copy]]] = {}
    level: dict[bytes, Copy] = {}

    def take(cid: bytes, copy: Copy) -> None:
        if copy[1].base is None:
            cur = level.get(cid)
            if cur is None or copy_key(copy) < copy_key(cur):
                level[cid] = copy
        else:
            users.setdefault(copy[1].base, []).append((cid, copy))

    for cid, cps in copies.items():
        for copy in cps:
            if usable is None or usable(copy[0]):
                take(cid, copy)
    for cid, copy in extra:
        take(cid, copy)
    depth = 0
    while level:
        for cid, copy in level.items():
            res.depth[cid] = depth
            res.best[cid] = copy
        depth += 1
        nxt: dict[bytes, Copy] = {}
        for base in level:
            for cid, copy in users.get(base, ()):
                if cid in res.depth:
                    continue
                cur = nxt.get(cid)
                if cur is None or copy_key(copy) < copy_key(cur):
                    nxt[cid] = copy
        level = nxt
    return res
