"""The manifest's msgpack body with its two ext types: a tensor placeholder (ext 1, its index) and a
tuple (ext 2, a msgpack array).

A tuple's payload is an opaque byte string to the msgpack level around it, so decoding it means a
second ``unpackb``.  Done from inside the ext hook, that recursion costs a C stack frame holding
msgpack's whole parser stack per level (200 nested tuples in a 1.7 KB manifest overflow an 8 MiB
stack) and keeps every level's payload alive at once (a 4 MiB manifest nested 120 deep held
500 MiB).  So the hook only wraps the payload; :func:`unpack_tree` then decodes wrapped tuples one
at a time from an explicit stack, dropping each payload once decoded: the live payload bytes never
exceed the manifest's size, and nesting is bounded by ``MAX_MSGPACK_DEPTH`` across ext levels.  A
byte inside k nested tuples is still copied k times, so the payloads summed over all tuples are
capped by ``MAX_TUPLE_PAYLOAD_BYTES``, on write (:func:`pack_tree`) as on read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import CorruptObjectError, LimitExceededError
from . import msgpack_io
from .limits import MAX_MSGPACK_DEPTH, MAX_TUPLE_PAYLOAD_BYTES

EXT_TENSOR = 1
EXT_TUPLE = 2


@dataclass(frozen=True)
class TensorRef:
    """Placeholder for a tensor inside the saved tree."""

    index: int


class TupleBudget:
    """The tuple payload bytes a reader may still decode (``MAX_TUPLE_PAYLOAD_BYTES`` to begin
    with): one budget shared by the fields of a manifest decoded one by one, so that splitting a
    manifest into fields never multiplies what a crafted one makes it copy."""

    __slots__ = ("left",)

    def __init__(self, left: int = MAX_TUPLE_PAYLOAD_BYTES) -> None:
        self.left = left


class _Tuple:
    """A tuple ext whose payload is not decoded yet."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


#: tuples nested in tuples that :func:`pack_tree` packs through msgpack's hook; deeper ones go
#: down the copying path (each level there is a C call holding msgpack's parser stack)
DIRECT_TUPLE_DEPTH = 8


class _TooDeep(Exception):
    """Raised out of the one-call packing of a tree whose tuples nest deeper than it takes."""


def _leaf(value: Any) -> msgpack.ExtType:
    """msgpack's ``default`` for a value it has no form for: a tensor reference's ext, else a
    refusal (a tuple never reaches it: each path packs tuples its own way first)."""
    if isinstance(value, TensorRef):
        return msgpack.ExtType(EXT_TENSOR, msgpack.packb(value.index))
    raise TypeError(f"cannot pack {type(value).__name__}")


class _Spent:
    """The tuple payload bytes one tree has packed, against what a reader accepts."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0

    def add(self, payload: bytes) -> None:
        self.bytes += len(payload)
        if self.bytes > MAX_TUPLE_PAYLOAD_BYTES:
            raise LimitExceededError(f"the saved tree nests tuples holding more than {MAX_TUPLE_PAYLOAD_BYTES} "
                                     "bytes counted at every level; use fewer nested tuples (lists or dicts)")


def pack_tree(body: Any) -> bytes:
    """msgpack of ``body`` with TensorRef and tuple exts; LimitExceededError when the tuples'
    payloads sum to more than a reader accepts.

    One msgpack call packs the tree, its hook packing each tuple's payload (an optimizer's
    ``betas``).  A tree whose tuples nest more than ``DIRECT_TUPLE_DEPTH`` deep, or one msgpack
    refuses, goes down :func:`_pack_copying`'s path, which packs the same bytes and raises the
    same errors without a C call per level.  Copying every tree cost a 1,000-node manifest ~1 ms,
    twice a save."""
    spent = _Spent()
    depth = 0

    def hook(value: Any) -> Any:
        nonlocal depth
        if type(value) is not tuple:
            return _leaf(value)
        if depth >= DIRECT_TUPLE_DEPTH:
            raise _TooDeep
        depth += 1
        try:
            payload = msgpack.packb(list(value), use_bin_type=True, default=hook, strict_types=True)
        finally:
            depth -= 1
        spent.add(payload)
        return msgpack.ExtType(EXT_TUPLE, payload)

    try:
        return msgpack.packb(body, use_bin_type=True, default=hook, strict_types=True)
    except (_TooDeep, LimitExceededError, TypeError, ValueError, OverflowError):
        return _pack_copying(body)


def _pack_copying(body: Any) -> bytes:
    """:func:`pack_tree` from an explicit stack: a copy of the tree with each tuple replaced by its
    ext, a tuple's payload packed before the tuple around it, not from msgpack's ``default`` hook,
    which would nest a packing call and several Python frames per level: a tree of tuples
    MAX_MSGPACK_DEPTH deep packs as any other tree that deep does."""
    spent = _Spent()

    def freeze(items: list) -> msgpack.ExtType:
        payload = msgpack.packb(items, use_bin_type=True, default=_leaf, strict_types=True)
        spent.add(payload)
        return msgpack.ExtType(EXT_TUPLE, payload)

    end = object()
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, Any, bool]] = []  # children, copy, parent, slot, is a tuple

    def place(value: Any, parent: Any, slot: Any) -> None:
        out: Any
        if type(value) is dict:
            parent[slot] = out = {}
            stack.append((iter(value.items()), out, parent, slot, False))
        elif type(value) in (list, tuple):
            parent[slot] = out = []
            stack.append((iter(value), out, parent, slot, type(value) is tuple))
        else:
            parent[slot] = value

    place(body, root, 0)
    while stack:
        children, out, parent, slot, is_tuple = stack[-1]
        item: Any = next(children, end)
        if item is end:
            stack.pop()
            if is_tuple:
                parent[slot] = freeze(out)
        elif isinstance(out, dict):
            out[item[0]] = None
            place(item[1], out, item[0])
        else:
            out.append(None)
            place(item, out, len(out) - 1)
    return msgpack.packb(root[0], use_bin_type=True, default=_leaf, strict_types=True)


def _small_index(payload: bytes) -> int | None:
    """A tensor reference's index where its payload is one of the forms writers produce (a positive
    fixint, uint8, uint16; msgpack's shortest form of a tensor count), read without a decoder call
    (a manifest holds one reference per tensor: a call each cost a 320-tensor manifest 3 ms); None
    for any other payload."""
    n = len(payload)
    if n == 1 and payload[0] < 0x80:
        return payload[0]
    if n == 2 and payload[0] == 0xCC:
        return payload[1]
    if n == 3 and payload[0] == 0xCD:
        return payload[1] << 8 | payload[2]
    return None


def unpack_tree(data: bytes | memoryview, *, what: str, max_bytes: int, refs: list[int], start: int = 0,
                budget: TupleBudget | None = None) -> Any:
    """Decode untrusted msgpack holding TensorRef and tuple exts, without recursion across exts.

    ``refs`` collects every tensor index met; ``start`` is the depth of the top value (values
    nested deeper than MAX_MSGPACK_DEPTH are refused); ``budget``: the tuple payload bytes left
    to decode, shared with other calls (a fresh one by default).  Raises CorruptObjectError (or
    its LimitExceededError) on anything malformed."""
    budget = TupleBudget() if budget is None else budget

    def hook(code: int, payload: bytes) -> Any:
        if code == EXT_TENSOR:
            idx = _small_index(payload)
            if idx is None:   # any other msgpack form of an integer: the general decoder and its checks
                value = msgpack_io.unpack(payload, what=f"{what} tensor reference", max_bytes=16)
                idx = msgpack_io.expect_int(value, f"{what} tensor reference", 0, 1 << 32)
            refs.append(idx)
            return TensorRef(idx)
        if code == EXT_TUPLE:
            budget.left -= len(payload)
            if budget.left < 0:
                raise LimitExceededError(f"{what}: nested tuples hold more than {MAX_TUPLE_PAYLOAD_BYTES} bytes "
                                         "counted at every level")
            return _Tuple(payload)
        raise CorruptObjectError(f"{what}: unknown msgpack ext type {code} in the tree")

    holder = [msgpack_io.unpack(data, what=what, max_bytes=max_bytes, ext_hook=hook)]
    tuples: list[tuple[Any, Any]] = []  # (container, key) of each decoded tuple, parents first
    end = object()
    stack: list[tuple[Any, Any, int]] = [(holder, iter(range(1)), start)]  # (container, keys, their depth)
    while stack:
        container, keys, depth = stack[-1]
        key = next(keys, end)
        if key is end:
            stack.pop()
            continue
        if depth > MAX_MSGPACK_DEPTH:
            raise LimitExceededError(f"{what}: tree nested deeper than {MAX_MSGPACK_DEPTH}")
        value = container[key]
        if isinstance(value, _Tuple):
            # rebinding both names drops the last reference to the payload once it is decoded
            value = container[key] = msgpack_io.unpack(value.data, what=f"{what} tuple", max_bytes=len(value.data),
                                                       ext_hook=hook)
            if not isinstance(value, list):
                raise CorruptObjectError(f"{what}: a tuple ext does not hold an array")
            tuples.append((container, key))
        if isinstance(value, msgpack.Timestamp):  # ext -1 is decoded by msgpack itself, not by our hook
            raise CorruptObjectError(f"{what}: msgpack timestamp (ext type -1) is not part of the format")
        if isinstance(value, dict):
            names = list(value)
            for name in names:
                if isinstance(name, (_Tuple, msgpack.Timestamp)):  # writers key maps by str or int only
                    raise CorruptObjectError(f"{what}: a map key is a {type(name).__name__.strip('_').lower()}")
            stack.append((value, iter(names), depth + 1))
        elif isinstance(value, list):
            stack.append((value, iter(range(len(value))), depth + 1))
    for container, key in reversed(tuples):  # children first: a parent's tuple holds its children's
        container[key] = tuple(container[key])
    return holder[0]
