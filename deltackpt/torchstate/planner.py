"""What to write and what to read: sharing groups, per-tensor encodings, layer selection.  No I/O."""

from __future__ import annotations

import fnmatch
from typing import Mapping

from ..codecs.pipeline import check_mode
from ..errors import CodecError
from ..format.dtypes import is_float
from ..format.manifest import TensorEntry
from ..repo.layers import layer_matcher, selected_tensors  # noqa: F401  (their old home)
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
