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
    "save": "api", "load": "api", "restore": "api", "gc": "api", "Repo": "api",
    "Version": "repo.versions", "GcReport": "repo.gc", "VerifyReport": "repo.verify", "Retention": "repo.retention",
    "resume": "training", "Checkpointer": "training", "Guard": "training", "SaveHandle": "snapshot.async_save",
    "EveryN": "training.policies", "EveryT": "training.policies", "YoungDaly": "training.policies",
    "DenseEarly": "training.policies", "OnImprovement": "training.policies", "AnyOf": "training.policies",
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
