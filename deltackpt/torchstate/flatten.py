"""Saved state <-> (tree of plain values with TensorRef placeholders, tensor leaves).

Plain leaves are msgpack values: None, bool, int (64-bit), float, str, bytes, and lists, tuples
and dicts (str or int keys) of them.  Anything else is refused with its path and a hint.
Tensors that share storage (tied weights, views) are grouped so they come back sharing it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..errors import UnsupportedLeafError
from ..format.limits import MAX_MSGPACK_DEPTH
from ..format.manifest import TensorRef

INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1  # msgpack's integers: int64 and uint64


@dataclass
class TensorLeaf:
    index: int
    key: tuple
    name: str
    tensor: torch.Tensor


def dotted(key: tuple) -> str:
    return ".".join(str(k) for k in key)


def _path(key: tuple) -> str:
    text = dotted(key) or "<root>"
    return text if len(text) <= 200 else f"{text[:120]}...{text[-60:]}"  # error messages stay readable


def _check_tensor(t: torch.Tensor, key: tuple) -> torch.Tensor:
    path = _path(key)
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(t, torch.nn.parameter.Buffer):
        raise UnsupportedLeafError(f"{path}: tensor subclass {type(t).__name__} is not supported; save "
                                   "t.as_subclass(torch.Tensor) (for DTensor use deltackpt.dcp)")
    if t.layout != torch.strided:
        raise UnsupportedLeafError(f"{path}: {t.layout} tensors are not supported; save t.to_dense() "
                                   "(or its indices and values)")
    if t.is_quantized:
        raise UnsupportedLeafError(f"{path}: quantized tensors are not supported; save t.int_repr(), "
                                   "t.q_scale() and t.q_zero_point() instead")
    if t.device.type == "meta":
        raise UnsupportedLeafError(f"{path}: tensor on the meta device has no data; materialize it first")
    if t.is_nested:
        raise UnsupportedLeafError(f"{path}: nested tensors are not supported; save t.unbind() as a list")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def int_text(value: int) -> str:
    """An integer for an error message: its digits, or its size when it has too many to print (str()
    of an int over 4300 digits raises ValueError)."""
    return str(value) if value.bit_length() <= 256 else f"of {value.bit_length()} bits"


def check_text(text: str, what: str) -> str:
    """``text`` if it can be stored (UTF-8, which has no lone surrogates), else
    UnsupportedLeafError naming ``what``; the check is free for ASCII text."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            # the message must itself be printable: show the text escaped, never as is
            raise UnsupportedLeafError(
                f"{what} {ascii(text[:60])}{'...' if len(text) > 60 else ''} holds a lone surrogate "
                f"({ascii(text[exc.start])} at index {exc.start}) and cannot be stored as UTF-8; fix the "
                "text, or store text.encode('utf-8', 'surrogatepass') as bytes") from None
    return text


_END = object()


def flatten(obj: Any, prefix: tuple = ()) -> tuple[Any, list[TensorLeaf]]:
    """Replace every tensor in ``obj`` with a TensorRef; return (tree, leaves in order).
    ``prefix``: where ``obj`` sits, for error messages (``("meta",)``).

    The walk keeps its own stack, not Python's: every depth up to MAX_MSGPACK_DEPTH saves (and
    loads, :func:`unflatten`) whatever the container type, and deeper is refused by the same line."""
    leaves: list[TensorLeaf] = []
    seen_names: dict[str, int] = {}

    def convert(value: Any, key: tuple, depth: int) -> tuple[Any, Any]:
        """(stored value, None) for a leaf; (empty container, (kind, children)) for a container."""
        if depth > MAX_MSGPACK_DEPTH:
            raise UnsupportedLeafError(f"{_path(key)}: nested deeper than {MAX_MSGPACK_DEPTH} levels")
        if isinstance(value, torch.Tensor):
            t = _check_tensor(value, key)
            name = _unique_name(dotted(key), seen_names, len(leaves))
            seen_names[name] = len(leaves)
            leaves.append(TensorLeaf(len(leaves), key, name, t))
            return TensorRef(len(leaves) - 1), None
        if isinstance(value, Mapping):
            return {}, ("dict", iter(value.items()))
        if isinstance(value, list):
            return [], ("list", iter(value))
        if type(value) is tuple or type(value) is torch.Size:
            return [], ("tuple", iter(value))
        return _plain_leaf(value, key), None

    root: list[Any] = [None]
    stack: list[tuple[str, Any, Any, tuple, int, Any, Any]] = []  # kind, children, out, key, depth, parent, slot

    def place(value: Any, key: tuple, depth: int, parent: Any, slot: Any) -> None:
        out, children = convert(value, key, depth)
        parent[slot] = out
        if children is not None:
            stack.append((children[0], children[1], out, key, depth, parent, slot))

    place(obj, prefix, 0, root, 0)
    while stack:
        kind, children, out, key, depth, parent, slot = stack[-1]
        item: Any = next(children, _END)
        if item is _END:
            stack.pop()
            if kind == "tuple":
                parent[slot] = tuple(out)
        elif kind == "dict":
            k, v = item
            plain = _plain_key(k, key)
            if plain in out:
                raise UnsupportedLeafError(f"{_path(key)}: dict keys {k!r:.40} and {plain!r:.40} are the same "
                                           "once saved; rename one")
            out[plain] = None
            place(v, key + (plain,), depth + 1, out, plain)
        else:
            out.append(None)
            place(item, key + (len(out) - 1,), depth + 1, out, len(out) - 1)
    return root[0], leaves


def _plain_leaf(value: Any, key: tuple) -> Any:
    """A leaf that is no tensor and no container, as stored; else the refusal saying why."""
    if value is None or type(value) in (bool, bytes):
        return value
    if isinstance(value, str):  # str subclasses (StrEnum, ...) are saved as plain str
        return check_text("" + value, f"{_path(key)}: string")
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise UnsupportedLeafError(f"{_path(key)}: integer {int_text(value)} does not fit in 64 bits; store it "
                                       "as a str")
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, bytearray):
        return bytes(value)
    raise _refusal(value, key)


def _unique_name(name: str, seen_names: dict[str, int], n_leaves: int) -> str:
    """``name``, or, when an earlier leaf has it (the same dotted name from different key paths:
    ``{"a.b": x, "a": {"b": y}}``), ``name#n``: both are kept, so layer selection and deltas
    still tell them apart."""
    if name not in seen_names:
        return name
    base, n = name, n_leaves
    name = f"{base}#{n}"
    while name in seen_names:  # a real key may already be spelled "a.b#2"
        n += 1
        name = f"{base}#{n}"
    return name


def _plain_key(k: Any, key: tuple) -> "str | int":
    """A dict key as stored: a str or a 64-bit int (IntEnum and str subclasses: their base value)."""
    if isinstance(k, bool) or not isinstance(k, (str, int)):
        raise UnsupportedLeafError(f"{_path(key)}: dict key {k!r:.40} of type {type(k).__name__} "
                                   "is not supported; use str or int keys")
    plain = ("" + k) if isinstance(k, str) else int(k)
    if isinstance(plain, str):
        check_text(plain, f"{_path(key)}: dict key")
    if isinstance(plain, int) and not INT_MIN <= plain <= INT_MAX:
        raise UnsupportedLeafError(f"{_path(key)}: dict key {int_text(plain)} does not fit in 64 bits; use a "
                                   "str key")
    return plain


def _refusal(value: Any, key: tuple) -> UnsupportedLeafError:
    """Why ``value`` cannot be stored (it would need pickle), with what to do instead."""
    if isinstance(value, torch.nn.Module):
        return UnsupportedLeafError(f"{_path(key)}: an nn.Module inside the state; save module.state_dict()")
    if isinstance(value, (torch.dtype, torch.device)):
        return UnsupportedLeafError(f"{_path(key)}: {type(value).__name__} values are not supported; store str(value)")
    hint = "convert it to plain types (numbers, strings, lists, dicts) or a tensor"
    if type(value).__module__ == "numpy":
        hint = "convert numpy values with torch.from_numpy(x) or x.tolist() / x.item()"
    return UnsupportedLeafError(f"{_path(key)}: {type(value).__module__}.{type(value).__qualname__} cannot be "
                                f"saved without pickle; {hint}")


def plain_only(value: Any, what: str) -> Any:
    """``value`` (metadata such as ``meta``) as a plain tree; tensors are refused."""
    tree, leaves = flatten(value, (what,))
    if leaves:
        raise UnsupportedLeafError(f"{what} may not hold tensors ({leaves[0].name or '<root>'}); use floats")
    return tree


def metrics_of(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """``metrics`` as str -> int/float, checked before anything is written."""
    out: dict[str, Any] = {}
    for k, v in (metrics or {}).items():
        if hasattr(v, "item") and callable(v.item):
            v = v.item()  # 0-d tensors and numpy scalars, the usual way losses arrive
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UnsupportedLeafError(f"metric {ascii(k):.80}: metrics are str -> number, got {type(v).__name__}")
        check_text(k, "metric name")
        if isinstance(v, int) and not INT_MIN <= v <= INT_MAX:
            raise UnsupportedLeafError(f"metric {k!r:.80}: integer {int_text(v)} does not fit in 64 bits; pass a float")
        out["" + k] = int(v) if isinstance(v, int) else float(v)
    return out


def unflatten(tree: Any, make: Any, keep: Any = None) -> Any:
    """Rebuild the saved object: TensorRef(i) -> make(i); tensors with ``keep(i)`` False are dropped
    from dicts (and become None in lists), so a layer load returns only what was asked for.  Like
    :func:`flatten`, it keeps its own stack: any depth a save accepted loads."""
    dropped = (lambda v: False) if keep is None else (lambda v: isinstance(v, TensorRef) and not keep(v.index))
    root: list[Any] = [None]
    stack: list[tuple[bool, Any, Any, Any, Any]] = []  # is_dict, children, out, parent, slot

    def place(value: Any, parent: Any, slot: Any) -> None:
        out: Any
        if isinstance(value, TensorRef):
            parent[slot] = make(value.index)
        elif isinstance(value, dict):
            parent[slot] = out = {}
            stack.append((True, iter(value.items()), out, parent, slot))
        elif isinstance(value, (list, tuple)):
            parent[slot] = out = []
            stack.append((False, iter(value), out, parent, slot if isinstance(value, list) else (slot,)))
        else:
            parent[slot] = value

    place(tree, root, 0)
    while stack:
        is_dict, children, out, parent, slot = stack[-1]
        item: Any = next(children, _END)
        if item is _END:
            stack.pop()
            if isinstance(slot, tuple):   # a tuple is built as a list, frozen once its items are in
                parent[slot[0]] = tuple(out)
        elif is_dict:
            if not dropped(item[1]):
                out[item[0]] = None
                place(item[1], out, item[0])
        else:
            out.append(None)
            if not dropped(item):
                place(item, out, len(out) - 1)
    return root[0]


def tensor_refs(tree: Any) -> "Iterator[tuple[tuple, TensorRef]]":
    """(path, TensorRef) for every tensor placeholder in ``tree``, depth first, without recursion."""
    stack: list[tuple[tuple, Any]] = [((), tree)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, TensorRef):
            yield path, value
        elif isinstance(value, dict):
            stack.extend((path + (k,), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, (list, tuple)):
            stack.extend((path + (n,), v) for n, v in reversed(list(enumerate(value))))


def contiguous_strides(shape: list[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return strides


def numel(shape: list[int]) -> int:
    return math.prod(shape)
