"""deltackpt: incremental, compressed, content-addressed checkpoints for PyTorch.

Example::

    import deltackpt
    v = deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "ckpt", step=100)
    deltackpt.restore(model, "ckpt", "latest", optimizer=opt)
    deltackpt.gc("ckpt", keep_last=3)

torch is imported lazily: opening, listing, verifying and collecting a repository need no torch.
"""

from __future__ import annotations

from typing import Any

from .errors import *  # noqa: F401,F403
from .errors import DeltackptError

__version__ = "0.1.0"

_LAZY = {
    "save": "frontend.api", "load": "frontend.api", "restore": "frontend.api", "gc": "frontend.api",
    "Repo": "frontend.api",
    "Version": "repo.versions", "GcReport": "repo.gc", "VerifyReport": "repo.verify", "Retention": "repo.retention",
    "resume": "frontend.training", "Checkpointer": "frontend.training", "SaveHandle": "frontend.async_save",
    "EveryN": "frontend.policies", "EveryT": "frontend.policies", "YoungDaly": "frontend.policies",
    "DenseEarly": "frontend.policies", "OnImprovement": "frontend.policies", "AnyOf": "frontend.policies",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'deltackpt' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["DeltackptError", "__version__", *_LAZY]
