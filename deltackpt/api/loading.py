"""Reading a version back: ``deltackpt.load`` into new tensors, ``deltackpt.restore`` straight into
a live model's parameters (and its optimizer's state), reading only the chunks that differ."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, TypeVar, overload

import numpy as np

from ..errors import InvalidArgumentError, StateMismatchError
from ..gcpause import collector_paused
from ..progress import bar
from ..repo.repository import Repository
from ..repo.versions import Version
from ..store.base import Store
from .handles import Handle, opened
from .targets import check_optimizer

if TYPE_CHECKING:
    import torch

    from ..format.manifest import Manifest
    from .types import Revision, Stateful

_Item = TypeVar("_Item")
_Tag = TypeVar("_Tag")


def _model_prefix(m: Manifest, model_keys: set[str]) -> str:
    names = {t.name for t in m.tensors}
    best, best_hits = "", -1
    for prefix in ("", "model."):
        hits = sum(1 for k in model_keys if prefix + k in names)
        if hits > best_hits:
            best, best_hits = prefix, hits
    return best


@overload
def load(repo: "str | os.PathLike[str] | Handle | Store", version: Revision = "latest", *,
         layers: Iterable[str] | str | None = None, map_location: "str | torch.device | None" = "cpu",
         return_version: Literal[False] = False, threads: int | None = None) -> Any: ...


@overload
def load(repo: "str | os.PathLike[str] | Handle | Store", version: Revision = "latest", *,
         layers: Iterable[str] | str | None = None, map_location: "str | torch.device | None" = "cpu",
         return_version: Literal[True], threads: int | None = None) -> tuple[Any, Version]: ...


@overload
def load(repo: "str | os.PathLike[str] | Handle | Store", version: Revision = "latest", *,
         layers: Iterable[str] | str | None = None, map_location: "str | torch.device | None" = "cpu",
         return_version: bool, threads: int | None = None) -> Any: ...


def load(repo: "str | os.PathLike[str] | Handle | Store", version: Revision = "latest", *,
         layers: Iterable[str] | str | None = None, map_location: "str | torch.device | None" = "cpu",
         return_version: bool = False, threads: int | None = None) -> Any:
    """Load a version: the saved structure with bit-identical tensors.

    Args:
        repo: the repository: a path or URL, a :class:`~deltackpt.Repo` or a store.
        version: which version: an id or a 4+ digit prefix, a tag, ``latest``, ``latest~N`` or
            ``best:METRIC[:min|:max]`` (or a :class:`~deltackpt.Version`).
        layers: module paths to load (``["encoder"]`` selects ``encoder.*`` and
            ``model.encoder.*``); only their tensors' chunks are read.  What comes back is the
            selected subtrees and the containers on the way to them: everything else is left out,
            plain values included (``layers=["model"]`` on a ``{"model": ..., "optimizer": ...,
            "step": ...}`` state returns ``{"model": {...}}``); a list keeps its length, with None
            where an item was left out.
        map_location: where the tensors go (``"cpu"``, ``"cuda:0"``, a torch.device; None: where
            they were saved).
        return_version: also return the :class:`~deltackpt.Version` loaded.
        threads: decode threads (default ``$DELTACKPT_READ_THREADS``, else every core).

    Returns:
        The saved structure (or ``(state, Version)`` with ``return_version``); ``Version.exact``
        says whether some tensor was stored lossily.  Its type is ``Any``: whatever structure was
        saved (a state dict, a :func:`~deltackpt.training.training_state`, a list, an imported
        file's layout), which only the caller knows.

    Raises:
        UnknownVersionError: no such version (the message suggests the closest names).
        InvalidArgumentError: ``map_location`` is not a device this process has (refused before
            anything is read).
        StateMismatchError: a layer that selects no tensor (the message lists the version's layers).
        CorruptObjectError: a damaged chunk or manifest, named with its version and tensor.

    Example:
        ```python
        state = deltackpt.load("ckpt", "latest~2")
        model.load_state_dict(state["model"])
        head = deltackpt.load("ckpt", layers=["head"])["model"]     # reads only the head's chunks
        ```
    """
    from ..repo.layers import select_tree, selected_tensors
    from ..torchstate.flatten import unflatten
    from ..torchstate.materialize import build_tensors, read_blobs, read_threads

    if threads is not None:
        read_threads(threads)  # refused before anything is read
    device = _device(map_location)
    with collector_paused(), opened(repo) as handle:
        core = handle.core
        vid = core.resolve(version)
        m = core.manifest(vid)
        core.index.refresh()
        chosen = selected_tensors(m, layers, f"version {vid[:10]}")
        blobs = {m.tensors[i].blob for i in chosen}
        with bar("load", sum(m.blobs[b].nbytes for b in blobs)):
            if device is not None and device.type not in ("cpu", "meta"):
                # decoded through pinned host windows straight into device memory (imported here:
                # a CPU load, a restart's usual one, does not pay for the module)
                from ..torchstate.to_device import read_blobs_to_device
                buffers: Any = read_blobs_to_device(core, vid, m, blobs, device, threads=threads)
            else:
                buffers = read_blobs(core, vid, m, blobs, threads=threads)
        tensors = build_tensors(m, chosen, buffers, map_location)
        tree = m.tree if layers is None else select_tree(m.tree, set(chosen).__contains__, layers)
        state = unflatten(tree, tensors.__getitem__)
        return (state, core.version(vid)) if return_version else state


def _device(map_location: "str | torch.device | None") -> "torch.device | None":
    """``map_location`` as a device this process has, refused before anything is read."""
    import torch

    if map_location is None:
        return None
    try:
        device = torch.device(map_location)
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise RuntimeError(f"this process sees {torch.cuda.device_count()} CUDA devices")
        if device.type not in ("cpu", "meta"):
            torch.empty(0, device=device)   # the device exists here and torch was built for it
    except (RuntimeError, AssertionError, TypeError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidArgumentError(f"map_location={map_location!r:.40} is not a device here: {reason:.120}") from None
    return device


def restore(model: "torch.nn.Module", repo: "str | os.PathLike[str] | Handle | Store", version: Revision = "latest",
            *, layers: Iterable[str] | str | None = None, optimizer: "Stateful | None" = None,
            strict: bool = True, threads: int | None = None) -> Version:
    """Copy a version into ``model``'s existing parameters and buffers, in place.

    Chunks are decoded straight into the parameters' memory (no second full copy on the CPU).  A
    rollback reads only what changed: each chunk of a contiguous CPU tensor is hashed where it
    lies; one the model already holds is neither read nor written, and one a few stored deltas
    away from it (the version before or after, by how the repository chains them) is stepped
    there in place, reading only those deltas.  Every other chunk is read whole.  A model (and
    optimizer) that does not match the version is refused before anything is written.

    Args:
        model: the module to restore into; its keys are the version's (or the version's
            ``model.*`` ones, for a saved training state).
        repo: the repository: a path or URL, a :class:`~deltackpt.Repo` or a store.
        version: which version (an id or prefix, a tag, ``latest~N``, ``best:METRIC``).
        layers: module paths: only those tensors are read and written; the rest of the model is
            untouched.
        optimizer: also load its state from the version's ``optimizer`` entry (into the
            optimizer's own state tensors where their shapes and dtypes match).
        strict: refuse a version whose tensors and the model's differ (False: restore the ones
            both have).
        threads: decode threads (default ``$DELTACKPT_READ_THREADS``, else every core).

    Returns:
        The :class:`~deltackpt.Version` restored.

    Raises:
        UnknownVersionError: no such version.
        StateMismatchError: the model or optimizer does not match the version (missing or
            unexpected keys, shapes, dtypes), or the version holds no optimizer; nothing was written.
        CorruptObjectError: a damaged chunk, named with its version and tensor.  That tensor may
            then be partly overwritten (in place means no spare copy): restore again from another
            version, or use :func:`deltackpt.resume`, which loads before it writes.

    Example:
        ```python
        deltackpt.restore(model, "ckpt", "latest~1", optimizer=opt)
        deltackpt.restore(model, "ckpt", layers=["encoder"])   # one layer, nothing else read
        ```
    """
    if threads is not None:
        from ..torchstate.materialize import read_threads
        read_threads(threads)  # refused before anything is read or written
    with collector_paused(), opened(repo) as handle:
        return _restore(model, handle.core, version, layers, optimizer, strict, threads)


def _restore(model: "torch.nn.Module", core: Repository, version: "str | Version",
             layers: Iterable[str] | str | None, optimizer: "Stateful | None", strict: bool,
             threads: int | None) -> Version:
    import torch

    vid = core.resolve(version)
    m = core.manifest(vid)
    core.index.refresh()
    target = model.state_dict(keep_vars=True)
    prefix = _model_prefix(m, set(target))
    wanted = _matching_tensors(m, vid, target, prefix, layers, strict)
    _check_tensors(m, vid, target, wanted)
    tree = m.tree
    if optimizer is not None:  # every part is checked before the first write: all or nothing
        if not isinstance(tree, dict) or "optimizer" not in tree:
            raise StateMismatchError(f"version {vid[:10]} holds no 'optimizer' entry to restore; nothing was restored")
        check_optimizer(optimizer, tree["optimizer"], where=f"version {vid[:10]}")
    wait_snapshots()   # a lazy save's copy (of any handle) may still be reading these parameters
    with torch.no_grad():
        _read_into_model(core, vid, m, target, wanted, threads)
    if optimizer is not None:
        with torch.no_grad():
            state = _load_subtree(core, vid, m, tree["optimizer"], _live_state(optimizer, tree["optimizer"]), threads)
        # torch's load_state_dict keeps a state tensor already of the parameter's dtype and device
        # (``Tensor.to`` returns it as is): the in-place ones are not copied again
        optimizer.load_state_dict(state)
    return core.version(vid)


def wait_snapshots() -> None:
    """Wait for the lazy snapshot copies every handle of this process still has in flight (they
    read live parameters that a restore is about to write)."""
    from ..snapshot import at_exit
    for runtime in at_exit.runtimes():
        runtime.wait_snapshots()


def _matching_tensors(m: Manifest, vid: str, target: dict[str, Any], prefix: str, layers: Iterable[str] | str | None,
                      strict: bool) -> list[tuple[str, int]]:
    """(model key, tensor index) for each tensor of the model that ``layers`` selects and the
    version holds; a model and version that do not match (``strict``) are refused here, before
    anything is read or written."""
    from ..repo.layers import layer_matcher

    by_name = {t.name: i for i, t in enumerate(m.tensors)}
    match = layer_matcher(layers)
    wanted = [k for k in target if match is None or match(k) or match(prefix + k)]
    if layers is not None and not wanted:
        raise StateMismatchError(f"version {vid[:10]}: no tensor of the model is under {list(layers) if not isinstance(layers, str) else [layers]}")
    missing = [k for k in wanted if prefix + k not in by_name]
    saved_model = [t.name[len(prefix):] for t in m.tensors if t.name.startswith(prefix)]
    unexpected = [k for k in saved_model if k not in target] if layers is None else []
    if strict and (missing or unexpected):
        raise StateMismatchError(f"version {vid[:10]} does not match the model: missing {missing[:5]}"
                                 f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                                 f"{'...' if len(unexpected) > 5 else ''} (pass strict=False to skip them)")
    return [(k, by_name[prefix + k]) for k in wanted if prefix + k in by_name]


def _read_into_model(core: Repository, vid: str, m: Manifest, target: dict[str, Any], wanted: list[tuple[str, int]],
                     threads: int | None) -> None:
    """Write each wanted tensor of version ``vid`` into the model's own tensor: in place where it
    can be (:func:`_write_in_place`), else read whole and copied."""
    from ..torchstate.materialize import build_tensors, read_blobs

    _, pending = _write_in_place(core, vid, m, [(i, target[k], (k, i)) for k, i in wanted], threads)
    if pending:
        buffers = read_blobs(core, vid, m, (m.tensors[i].blob for _, i in pending), threads=threads)
        built = build_tensors(m, [i for _, i in pending], buffers)
        for k, i in pending:
            target[k].copy_(built[i])


def _write_in_place(core: Repository, vid: str, m: Manifest, dests: "list[tuple[int, Any, _Tag]]",
                    threads: int | None) -> tuple[list[_Tag], list[_Tag]]:
    """Decode each (tensor index, destination, tag) of version ``vid`` straight into its
    destination where it can: writable CPU memory of its own (every chunk in one parallel pass,
    chunks it already holds kept or stepped in place), or a contiguous device tensor (through
    pinned host windows, :mod:`deltackpt.torchstate.to_device`).  Returns the tags written (a
    duplicate of a written destination counts) and the rest, to be read and copied in."""
    from ..torchstate.materialize import is_own_blob, read_into
    from ..torchstate.tensor_bytes import writable_bytes
    from ..torchstate.to_device import copy_blobs_to_device

    host: list[tuple[int, memoryview, _Tag]] = []
    device: list[tuple[int, Any, _Tag]] = []
    rest: list[_Tag] = []
    for i, dst, tag in dests:
        e = m.tensors[i]
        own = is_own_blob(m, e)
        out = writable_bytes(dst) if own else None
        if out is not None:
            host.append((e.blob, out.data, tag))
        elif own and dst.device.type != "cpu" and dst.is_contiguous():
            device.append((e.blob, dst, tag))
        else:
            rest.append(tag)
    host, host_rest, host_same = _disjoint(host, _host_span)
    device, device_rest, device_same = _disjoint(device, _device_span)
    if device:
        copy_blobs_to_device(core, vid, m, [(b, dst) for b, dst, _ in device], threads=threads)
    if host:
        read_into(core, vid, m, [(b, mv) for b, mv, _ in host], live=True, threads=threads)
    written = [d[2] for d in host + host_same] + [d[2] for d in device + device_same]
    return written, [d[2] for d in host_rest] + [d[2] for d in device_rest] + rest


def _check_tensors(m: Manifest, vid: str, target: dict[str, Any], wanted: list[tuple[str, int]]) -> None:
    """Every destination is a tensor of the saved shape and dtype, checked before the first write."""
    import torch

    for k, i in wanted:
        e, dst = m.tensors[i], target[k]
        if not isinstance(dst, torch.Tensor):
            raise StateMismatchError(f"version {vid[:10]}, tensor {k}: the model holds a {type(dst).__name__}, "
                                     "the version a tensor; nothing was restored")
        if list(dst.shape) != e.shape or str(dst.dtype).removeprefix("torch.") != e.dtype:
            raise StateMismatchError(f"version {vid[:10]}, tensor {k}: saved {e.dtype}{e.shape}, model has "
                                     f"{str(dst.dtype).removeprefix('torch.')}{list(dst.shape)}; nothing was restored")


def _disjoint(items: list[_Item], span: "Callable[[_Item], tuple[int, int, int]]",
              ) -> tuple[list[_Item], list[_Item], list[_Item]]:
    """Split in-place destinations (``span``: start address, bytes, blob) into ones that share no
    byte (a live restore reads each destination as its chunk's base; device windows are written
    by several threads in any order), the rest, to be read and copied in, and the duplicates:
    tied weights saved as one blob are written through one destination, which the others are."""
    keep: list[_Item] = []
    rest: list[_Item] = []
    same: list[_Item] = []
    end, last = -1, None
    for d in sorted(items, key=lambda d: span(d)[0]):
        start, n, blob = span(d)
        if start >= end:
            keep.append(d)
            end, last = start + n, (start, n, blob)
        else:
            (same if last == (start, n, blob) else rest).append(d)
    return keep, rest, same


def _host_span(d: tuple[int, memoryview, Any]) -> tuple[int, int, int]:
    return np.frombuffer(d[1], dtype=np.uint8).ctypes.data, len(d[1]), d[0]


def _device_span(d: tuple[int, Any, Any]) -> tuple[int, int, int]:
    return d[1].data_ptr(), d[1].numel() * d[1].element_size(), d[0]


def _live_state(optimizer: "Stateful", saved: Any) -> "dict[tuple[Any, ...], torch.Tensor]":
    """The optimizer's own state tensors by path in its state_dict, when its param groups have
    the saved layout (else {}: load_state_dict then refuses the version before anything changes)."""
    import torch

    mine = optimizer.state_dict()  # its values are the optimizer's state tensors, not copies
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or len(groups) != len(mine["param_groups"]) or any(
            not isinstance(g, dict) or len(g.get("params", ())) != len(h["params"])
            for g, h in zip(groups, mine["param_groups"])):
        return {}
    out: dict[tuple[Any, ...], torch.Tensor] = {}
    for pid, per in mine["state"].items():
        for key, t in per.items():
            if isinstance(t, torch.Tensor):
                out[("state", pid, key)] = t
    return out


def _load_subtree(core: Repository, vid: str, m: Manifest, subtree: Any,
                  live: "dict[tuple[Any, ...], torch.Tensor] | None" = None,
                  threads: int | None = None) -> Any:
    """The saved ``subtree`` with its tensors read; a tensor whose path in ``live`` names a tensor
    of the same shape and dtype is decoded into that one, in place, and stands for itself."""
    from ..torchstate.flatten import tensor_refs, unflatten
    from ..torchstate.materialize import build_tensors, read_blobs

    indices: list[int] = []
    dests: list[tuple[int, torch.Tensor, tuple[torch.Tensor, int]]] = []
    for path, v in tensor_refs(subtree):
        e, dst = m.tensors[v.index], (live or {}).get(path)
        if dst is not None and list(dst.shape) == e.shape and str(dst.dtype).removeprefix("torch.") == e.dtype:
            dests.append((v.index, dst, (dst, v.index)))
        else:
            indices.append(v.index)
    written, rest = _write_in_place(core, vid, m, dests, threads)
    indices += [i for _, i in rest]
    buffers = read_blobs(core, vid, m, (m.tensors[i].blob for i in indices), threads=threads)
    tensors = build_tensors(m, indices, buffers)
    tensors.update({i: dst for dst, i in written})   # a duplicate is its written one's memory
    return unflatten(subtree, tensors.__getitem__)
