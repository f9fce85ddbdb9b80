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

# the one version number: pyproject.toml reads it (setuptools dynamic version), manifests record it
__version__ = "0.1.0"

_LAZY = {
    "save": "api", "load": "api", "restore": "api", "gc": "api", "Repo": "api",
    "Version": "repo.versions", "GcReport": "repo.maintain.gc_plan", "VerifyReport": "repo.maintain.verify",
    "Retention": "repo.maintain.retention",
    "resume": "training", "Checkpointer": "training", "Guard": "training", "SaveHandle": "snapshot.handle",
    "BackgroundOptions": "snapshot.runtime",
    "EveryN": "training.policies", "EveryT": "training.policies", "YoungDaly": "training.policies",
    "DenseEarly": "training.policies", "OnImprovement": "training.policies", "AnyOf": "training.policies",
}


#: submodules reachable as attributes after a bare ``import deltackpt`` (``deltackpt.dcp.Writer``),
#: imported at first use: each pulls in an optional framework
_LAZY_MODULES = {"dcp"}


def __getattr__(name: str) -> Any:
    import importlib
    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)   # the import binds it as an attribute
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'deltackpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["DeltackptError", "__version__", *_LAZY]
