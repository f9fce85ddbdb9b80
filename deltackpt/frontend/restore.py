"""Restoring a version into a live model (and optimizer): decoded straight into the parameters."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable

from ..errors import StateMismatchError
from ..format.manifest import TensorRef
from ..repo.repository import Repository
from ..repo.versions import Version
from ..store.base import Store

if TYPE_CHECKING:
    import torch

    from .api import Repo


def _model_prefix(m: Any, model_keys: set[str]) -> str:
    names = {t.name for t in m.tensors}
    best, best_hits = "", -1
    for prefix in ("", "model."):
        hits = sum(1 for k in model_keys if prefix + k in names)
        if hits > best_hits:
            best, best_hits = prefix, hits
    return best


def restore(model: "torch.nn.Module", repo: "str | os.PathLike | Repo | Store", version: "str | Version" = "latest",
            *, layers: Iterable[str] | str | None = None, optimizer: "torch.optim.Optimizer | None" = None,
            strict: bool = True) -> Version:
    """Copy a version into ``model``'s existing parameters and buffers, in place.

    Chunks are decoded straight into the parameters' memory (no second full copy on the CPU).
    With ``layers``, only those tensors are read and written; the rest of the model is untouched.
    With ``optimizer``, its state is loaded from the version's ``optimizer`` entry.

    Chunks are hash-checked as they land; a corrupt one raises CorruptObjectError naming the
    version and tensor, and that tensor may then be partly overwritten (in-place means no spare
    copy): restore again from another version, or use :func:`deltackpt.resume`, which does.

    Example::

        deltackpt.restore(model, "ckpt", "latest~1", optimizer=opt)
        deltackpt.restore(model, "ckpt", layers=["encoder"])   # one layer, nothing else read
    """
    import torch

    from .api import _repo  # api re-exports this module's restore: import it when called
    from .materialize import build_tensors, is_own_blob, read_blobs, read_into
    from .planner import layer_matcher
    from .tensor_bytes import copy_blob_to_device, writable_bytes

    r = _repo(repo)
    core = r.core
    vid = core.resolve(version)
    m = core.manifest(vid)
    core.refresh_index()
    target = model.state_dict(keep_vars=True)
    prefix = _model_prefix(m, set(target))
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
    pending: list[tuple[str, int]] = []
    direct: list[tuple[int, memoryview]] = []
    from .async_save import wait_snapshots
    wait_snapshots()   # a lazy save's copy may still be reading these parameters
    with torch.no_grad():
        for k in wanted:
            i = by_name.get(prefix + k)
            if i is None:
                continue
            e, dst = m.tensors[i], target[k]
            if not isinstance(dst, torch.Tensor):
                raise StateMismatchError(f"{k}: the model holds a {type(dst).__name__}, the version a tensor")
            if list(dst.shape) != e.shape or str(dst.dtype).removeprefix("torch.") != e.dtype:
                raise StateMismatchError(f"version {vid[:10]}, tensor {k}: saved {e.dtype}{e.shape}, "
                                         f"model has {str(dst.dtype).removeprefix('torch.')}{list(dst.shape)}")
            out = writable_bytes(dst)
            if out is None and dst.device.type != "cpu" and dst.is_contiguous() and is_own_blob(m, e):
                copy_blob_to_device(core, m.blobs[e.blob], dst)  # staged a chunk at a time
                continue
            if out is not None and is_own_blob(m, e):
                direct.append((e.blob, memoryview(out)))
            else:
                pending.append((k, i))
        if direct:  # every chunk of every such tensor decoded in one parallel pass, in place
            read_into(core, vid, m, direct)
        if pending:
            buffers = read_blobs(core, vid, m, (m.tensors[i].blob for _, i in pending))
            built = build_tensors(m, [i for _, i in pending], buffers)
            for k, i in pending:
                target[k].copy_(built[i])
    if optimizer is not None:
        tree = m.tree
        if not isinstance(tree, dict) or "optimizer" not in tree:
            raise StateMismatchError(f"version {vid[:10]} holds no 'optimizer' entry to restore")
        optimizer.load_state_dict(_load_subtree(core, vid, m, tree["optimizer"]))
    return core.version(vid)


def _load_subtree(core: Repository, vid: str, m: Any, subtree: Any) -> Any:
    from .flatten import unflatten
    from .materialize import build_tensors, read_blobs

    indices: list[int] = []

    def collect(v: Any) -> None:
        if isinstance(v, TensorRef):
            indices.append(v.index)
        elif isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)

    collect(subtree)
    buffers = read_blobs(core, vid, m, (m.tensors[i].blob for i in indices))
    tensors = build_tensors(m, indices, buffers)
    return unflatten(subtree, tensors.__getitem__)
