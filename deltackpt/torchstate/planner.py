"""What to write and what to read: sharing groups, per-tensor encodings, layer selection.  No I/O."""

from __future__ import annotations

import difflib
import fnmatch
from typing import Callable, Iterable, Mapping, overload

from ..codecs.pipeline import check_mode
from ..errors import CodecError, StateMismatchError
from ..format.dtypes import is_float
from ..format.manifest import Manifest, TensorEntry
from ..repo.write.saver import BlobInput
from .dtypes import name_of
from .flatten import TensorLeaf, contiguous_strides
from .tensor_bytes import byte_view, storage_view


def _row_bytes(shape: list[int], itemsize: int) -> int:
    if not shape or shape[0] == 0:
        return itemsize
    n = itemsize
    for d in shape[1:]:
        n *= d
    return n


def encoding_for(name: str, dtype: str, encoding: Mapping[str, str] | str | None) -> str:
    """The first pattern that matches ``name`` (fnmatch, in the given order) picks the mode; lossy
    modes apply to float tensors only, everything else stays lossless."""
    if encoding is None:
        return "lossless"
    if isinstance(encoding, str):
        mode = check_mode(encoding)
    else:
        mode = "lossless"
        for pattern, m in encoding.items():
            if fnmatch.fnmatchcase(name, pattern):
                mode = check_mode(m)
                break
    if mode != "lossless" and not is_float(dtype):
        return "lossless"
    return mode


def plan_blobs(leaves: list[TensorLeaf], encoding: Mapping[str, str] | str | None = None
               ) -> tuple[list[BlobInput], list[TensorEntry]]:
    """One blob per tensor, except tensors that share a storage, which share its blob."""
    if isinstance(encoding, Mapping):
        for m in encoding.values():
            check_mode(m)
    elif isinstance(encoding, str):
        check_mode(encoding)
    elif encoding is not None:
        raise CodecError(f"encoding must be a mode name or a {{pattern: mode}} dict, not {type(encoding).__name__}")
    groups: dict[tuple, list[TensorLeaf]] = {}
    for leaf in leaves:
        t = leaf.tensor
        if t.untyped_storage().nbytes() == 0:
            continue
        groups.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(leaf)
    shared = {id(leaf): g for g in groups.values() if len(g) > 1 for leaf in g}
    blobs: list[BlobInput] = []
    entries: list[TensorEntry] = []
    storage_blob: dict[int, int] = {}
    for leaf in leaves:
        t = leaf.tensor
        dtype = name_of(t.dtype, leaf.name)
        shape = list(t.shape)
        isz = t.element_size()
        group = shared.get(id(leaf))
        if group is None and t.device.type == "cpu" and 0 < t.untyped_storage().nbytes() < t.numel() * isz:
            # an overlapping view (expand, stride 0) spans more elements than its storage holds:
            # store the storage and the strides, as for shared storage, rather than materialize
            # every element (a 4-byte tensor expanded to 2^40 elements would need 4 TiB)
            group = [leaf]
        if group is None:
            data = byte_view(t)
            mode = encoding_for(leaf.name, dtype, encoding)
            blobs.append(BlobInput(("t",) + leaf.key + (dtype,), data, dtype, isz, _row_bytes(shape, isz), mode))
            entries.append(TensorEntry(leaf.name, list(leaf.key), dtype, shape, contiguous_strides(shape),
                                       len(blobs) - 1, 0, device=str(t.device)))
            continue
        gid = id(group[0])
        if gid not in storage_blob:
            data = storage_view(t)
            blobs.append(BlobInput(("s",) + group[0].key, data, dtype, isz, isz, "lossless"))
            storage_blob[gid] = len(blobs) - 1
        entries.append(TensorEntry(leaf.name, list(leaf.key), dtype, shape, list(t.stride()), storage_blob[gid],
                                   int(t.storage_offset()) * isz, device=str(t.device)))
    return blobs, entries


@overload
def layer_matcher(layers: None) -> None: ...


@overload
def layer_matcher(layers: Iterable[str] | str) -> Callable[[str], bool]: ...


def layer_matcher(layers: Iterable[str] | str | None) -> Callable[[str], bool] | None:
    """A predicate on dotted tensor names: ``encoder`` selects ``encoder.*`` and ``model.encoder.*``
    (on dot boundaries, so ``encoder`` does not select ``encoder2``)."""
    if layers is None:
        return None
    if isinstance(layers, str):
        layers = [layers]
    prefixes = []
    for layer in layers:
        layer = layer.strip(".")
        prefixes += [layer, f"model.{layer}"]

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
            if not any(one(manifest.tensors[i].name) for i in chosen):
                raise StateMismatchError(f"{what}: layer {layer!r:.80} selects no tensor; {_layer_hint(manifest, layer)}")
    return chosen


def _layer_hint(manifest: Manifest, layer: str) -> str:
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
