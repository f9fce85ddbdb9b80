"""Layer selection: which of a version's tensors (and which parts of its saved structure) a list
of module paths names.  Torch-free, so ``deltackpt show --layer`` works where torch is missing."""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable

from ..errors import StateMismatchError
from ..format.manifest import Manifest, TensorRef


def _prefixes(layers: Iterable[str] | str) -> list[str]:
    """The dotted names a layer list selects the subtrees of: ``encoder`` and ``model.encoder``."""
    out = []
    for layer in [layers] if isinstance(layers, str) else layers:
        layer = layer.strip(".")
        out += [layer, f"model.{layer}"]
    return out


def layer_matcher(layers: Iterable[str] | str | None) -> Callable[[str], bool] | None:
    """A predicate on dotted tensor names: ``encoder`` selects ``encoder.*`` and ``model.encoder.*``
    (on dot boundaries, so ``encoder`` does not select ``encoder2``)."""
    if layers is None:
        return None
    prefixes = _prefixes(layers)

    def match(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    return match


def selected_tensors(manifest: Manifest, layers: Iterable[str] | str | None, what: str = "the version") -> list[int]:
    """The indices of the tensors ``layers`` selects (every tensor when None).  A layer that selects
    nothing is a StateMismatchError naming it and the layers there are, never an empty selection
    (which ``deltackpt restore --layer`` wrote as an empty file, exiting 0)."""
    match = layer_matcher(layers)
    chosen = [i for i, t in enumerate(manifest.tensors) if match is None or match(t.name)]
    if layers is not None:
        for layer in [layers] if isinstance(layers, str) else list(layers):
            one = layer_matcher([layer])
            assert one is not None
            if not any(one(manifest.tensors[i].name) for i in chosen):
                raise StateMismatchError(f"{what}: layer {layer!r:.80} selects no tensor; {layer_hint(manifest, layer)}")
    return chosen


def layer_hint(manifest: Manifest, layer: str) -> str:
    """Which layers the version has: the closest names to ``layer``, and its top-level names."""
    prefixes: set[str] = set()
    top: dict[str, None] = {}
    for t in manifest.tensors:
        parts = t.name.split(".")
        top.setdefault(parts[0])
        prefixes.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    close = difflib.get_close_matches(layer.strip("."), sorted(prefixes), n=3, cutoff=0.6)
    names = list(top)
    listed = ", ".join(n for n in names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    guess = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{guess}its top-level layers: {listed or 'none (it holds no tensor)'}"


_END = object()


def select_tree(tree: Any, keep: Callable[[int], bool], layers: Iterable[str] | str) -> Any:
    """The part of a saved structure a layer selection returns: every subtree whose dotted path
    ``layers`` selects (its plain values too), the tensors ``keep`` selects, and the containers on
    the way to them.  Everything else is left out of dicts (and is None in lists, so positions keep
    their meaning): ``load(..., layers=["model"])`` returns no optimizer entry, not even its plain
    values.  It keeps its own stack, as :func:`deltackpt.torchstate.flatten.unflatten` does, and
    stops spelling a path once it is longer than every layer (a tree as deep as a save allows
    costs no quadratic strings)."""
    match = layer_matcher(layers)
    assert match is not None
    longest = max(len(p) for p in _prefixes(layers)) + 1
    root: list[Any] = [None]
    # a container being walked: is_dict, its items, the copy being built, whether its own path is
    # selected, its dotted path (None once no layer can start below it), whether anything in it
    # is kept, where it goes in its parent, whether it is a tuple
    stack: list[list[Any]] = []

    def visit(value: Any, name: str | None, inside: bool, parent: Any, slot: Any) -> bool:
        """Place ``value`` (or start walking it); whether it is kept (a container: decided later)."""
        if not inside and name is not None:
            inside = match(name)
            name = None if inside or len(name) > longest else name
        if isinstance(value, TensorRef):
            if keep(value.index):
                parent[slot] = value
                return True
            return False
        if isinstance(value, (dict, list, tuple)):
            out: Any = {} if isinstance(value, dict) else []
            parent[slot] = out   # a placeholder, so a dict keeps its order; removed if nothing is kept
            items = iter(value.items()) if isinstance(value, dict) else iter(enumerate(value))
            stack.append([isinstance(value, dict), items, out, inside, name, inside, parent, slot,
                          isinstance(value, tuple)])
            return True
        if inside:
            parent[slot] = value
        return inside

    visit(tree, "", False, root, 0)
    while stack:
        frame = stack[-1]
        is_dict, items, out, inside, name, _, parent, slot, is_tuple = frame
        item: Any = next(items, _END)
        if item is _END:
            stack.pop()
            if not frame[5]:       # nothing kept inside, and not selected itself
                _drop(parent, slot)
            elif is_tuple:
                parent[slot] = tuple(out)
            if frame[5] and stack:
                stack[-1][5] = True
            continue
        k, v = item
        child = None if name is None else f"{name}.{k}" if name else str(k)
        if is_dict:
            out[k] = None
        else:
            out.append(None)
        depth = len(stack)
        if visit(v, child, inside, out, k if is_dict else len(out) - 1):
            if len(stack) == depth:   # a kept leaf (a container reports when its walk ends)
                frame[5] = True
        elif is_dict:
            del out[k]
    return root[0]


def _drop(parent: Any, slot: Any) -> None:
    if isinstance(parent, dict):
        del parent[slot]
    else:
        parent[slot] = None
