"""A version as a model folder ``from_pretrained`` reads: ``config.json``, ``model.safetensors`` and,
given a tokenizer, its files.  Only the weights are read from the repository (``layers=["model"]``);
nothing of the optimizer and no pickle goes into the folder.

Example::

    export("ckpt", "model-out", "best:eval_loss", tokenizer=tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained("model-out")
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import torch

from ...api import Repo, internal, load
from ...errors import FileAccessError, StateMismatchError
from . import layout

#: the names ``from_pretrained`` looks for
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def export(repo: "str | os.PathLike | Repo", directory: "str | os.PathLike", version: Any = "latest", *,
           tokenizer: Any = None, config: Any = None) -> str:
    """Write ``version`` (any revision: ``"best:eval_loss"``, the ``"trainer-best"`` tag, ``"latest~1"``) as a
    folder that ``AutoModel*.from_pretrained(directory)`` loads, and return its absolute path.

    The model config is the one the version recorded when it was saved (versions written by
    :class:`~deltackpt.integrations.hf.DeltackptTrainer` or ``DeltackptCallback``); ``config`` (a
    ``PretrainedConfig`` or its dict) supplies or replaces it.  ``tokenizer``: written with its own
    ``save_pretrained``.  The files are written beside the folder first and moved in once all are
    complete; other files in ``directory`` are left alone.

    Example::

        path = export("ckpt", "model-out", tokenizer=tokenizer)
        model = AutoModelForSequenceClassification.from_pretrained(path)
    """
    from safetensors.torch import save_file

    handle = repo if isinstance(repo, Repo) else Repo(repo)
    try:
        state, v = load(handle, version, layers=[layout.MODEL], return_version=True)
        # the config is plain text in the saved structure, beside the weights (not a layer: no tensor)
        tree = internal.manifest(handle, v.id).tree
        stored = tree.get(layout.CONFIG) if isinstance(tree, dict) else None
    finally:
        if handle is not repo:
            handle.close()
    where = f"version {v.short_id}"
    weights = state.get(layout.MODEL) if isinstance(state, dict) else None
    if not isinstance(weights, dict) or not weights:
        raise StateMismatchError(f"{where} holds no 'model' entry: export writes versions saved by DeltackptTrainer "
                                 "or DeltackptCallback")
    config_text = _config_text(config, stored, where)
    out = os.path.abspath(os.fspath(directory))
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise FileAccessError(f"{out}: the folder {parent} does not exist")
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileAccessError(f"{out}: is a file; name a folder to write the model into")
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        save_file(_standalone(weights), os.path.join(staging, WEIGHTS_NAME),
                  metadata={"format": "pt", "deltackpt_version": v.id})
        with open(os.path.join(staging, CONFIG_NAME), "w", encoding="utf-8") as f:
            f.write(config_text)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), os.path.join(out, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _config_text(config: Any, stored: Any, where: str) -> str:
    if config is None:
        if not isinstance(stored, str):
            raise StateMismatchError(f"{where} recorded no model config (saved before deltackpt recorded one): "
                                     "pass config=model.config")
        return stored
    data = config if isinstance(config, dict) else json.loads(config.to_json_string())
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _standalone(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What safetensors accepts: contiguous tensors, each owning its storage.  Tied weights (one
    storage under two names) are each given a copy; ``from_pretrained`` ties them again."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        storage = t.untyped_storage()
        alone = (t.is_contiguous() and storage.data_ptr() not in seen
                 and storage.nbytes() == t.numel() * t.element_size())
        if t.numel():
            seen.add(storage.data_ptr())
        out[name] = t if alone else t.contiguous().clone()
    return out
