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
    # the bases some copy is a delta against that have no chain themselves (usually none): a
    # chunk indexed later under one of those ids may give other chunks a chain (extended())
    dangling: frozenset[bytes] = frozenset()

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
    res.dangling = frozenset(b for b in users if b not in res.depth)
    return res


def extended(res: Resolution, fresh: Mapping[bytes, list[Copy]], *, in_place: bool = False) -> Resolution | None:
    """``res`` with chunks indexed for the first time added (``fresh``: their copies), as
    :func:`resolve` over every copy would choose, without walking the others again: a new chunk
    changes no other chunk's chain, as no copy indexed before reads through it.  None when one
    does (a copy named it as its base before it was indexed): resolve again.  A new Resolution
    (threads may be reading the old one), or ``res`` itself grown when ``in_place`` (readers then
    see chunks added, no choice changed)."""
    if not res.dangling.isdisjoint(fresh):
        return None
    if in_place:
        res._children, res._heights = None, {}   # (what reads through what: built again when asked)
    out = res if in_place else Resolution(dict(res.best), dict(res.depth))
    _choose(out, dict(fresh))
    out.dangling = res.dangling | {c[1].base for cps in fresh.values() for c in cps
                                   if c[1].base is not None and c[1].base not in out.depth}
    if res._children is not None:   # grown as the choice grew; a list that gains a chunk is a new list
        children = dict(res._children)
        for cid in fresh:
            base = out.best[cid][1].base if cid in out.best else None
            if base is not None:
                children[base] = children.get(base, []) + [cid]
        out._children = children
    return out


def without(res: Resolution, copies: Mapping[bytes, list[Copy]], pack_entries: Mapping[str, list[PackEntry]],
            unusable: set[str], extra: Iterable[tuple[bytes, Copy]] = ()) -> Resolution | None:
    """What :func:`resolve` chooses with the packs ``unusable`` left out and ``extra`` copies added,
    from ``res`` (the choice over every copy), walking only the chunks whose chosen chain passed
    through a left-out pack or that ``extra`` names: every other chunk keeps its chain, as
    nothing gets shorter where copies are only taken away.  None when an ``extra`` copy could
    make a chain shorter than ``res`` has it (or give a chunk with none one): walk everything.
    Its cost follows the packs left out, not the index."""
    added: dict[bytes, list[Copy]] = {}
    for cid, copy in extra:
        base = copy[1].base
        floor = 0 if base is None else res.depth.get(base, -2) + 1
        have = res.depth.get(cid)
        if have is None or 0 <= floor < have:
            return None
        added.setdefault(cid, []).append(copy)
    kids = res._kids()
    stack = [e.chunk_id for pid in unusable for e in pack_entries.get(pid, ())
             if res.best.get(e.chunk_id, (None,))[0] == pid]
    stack += added
    again: set[bytes] = set()
    while stack:
        cid = stack.pop()
        if cid not in again:
            again.add(cid)
            stack.extend(kids.get(cid, ()))
    out = Resolution(dict(res.best), dict(res.depth))
    for cid in again:
        out.best.pop(cid, None)
        out.depth.pop(cid, None)
    _choose(out, {cid: [c for c in copies.get(cid, ()) if c[0] not in unusable] + added.get(cid, [])
                  for cid in again})
    return out


def _choose(out: Resolution, pending: dict[bytes, list[Copy]]) -> None:
    """Give the ``pending`` chunks their shortest chains over the chunks ``out`` has chosen,
    shallowest first, as the breadth-first walk of :func:`resolve` does (ties by copy_key);
    those with no chain are left out."""
    while pending:
        offers: dict[bytes, tuple[int, Copy]] = {}
        for cid, cps in pending.items():
            for copy in cps:
                base = copy[1].base
                d = 0 if base is None else out.depth.get(base, -2) + 1
                if d < 0:
                    continue
                cur = offers.get(cid)
                if cur is None or (d, copy_key(copy)) < (cur[0], copy_key(cur[1])):
                    offers[cid] = (d, copy)
        if not offers:
            return
        low = min(d for d, _ in offers.values())
        for cid, (d, copy) in offers.items():
            if d == low:
                out.depth[cid], out.best[cid] = d, copy
                del pending[cid]
