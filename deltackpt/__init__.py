"""deltackpt: incremental, compressed, content-addressed checkpoints for PyTorch.

Example::

    import deltackpt
    v = deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "ckpt", step=100)
    deltackpt.restore(model, "ckpt", "latest", optimizer=opt)
    deltackpt.gc("ckpt", keep_last=3)

torch is imported lazily: opening, listing, verifying and collecting a repository need no torch.
The public names are imported at first use (``__getattr__``); type checkers and IDEs see them
through the ``TYPE_CHECKING`` imports below, and ``dir(deltackpt)`` lists them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import *  # noqa: F401,F403
from .errors import DeltackptError
from .lazy_names import first_use_importer

if TYPE_CHECKING:   # what __getattr__ returns, for type checkers (never imported here at run time)
    from . import dcp as dcp
    from .api import Repo as Repo, gc as gc, load as load, restore as restore, save as save
    from .repo.maintain.gc_plan import GcReport as GcReport
    from .repo.maintain.retention import Retention as Retention
    from .repo.maintain.verify import VerifyReport as VerifyReport
    from .repo.versions import Version as Version
    from .snapshot.async_save import SaveHandle as SaveHandle
    from .snapshot.runtime import BackgroundOptions as BackgroundOptions
    from .training.checkpointer import Checkpointer as Checkpointer
    from .training.guard import Guard as Guard
    from .training.resume import resume as resume
    from .training.policies import (AnyOf as AnyOf, DenseEarly as DenseEarly, EveryN as EveryN, EveryT as EveryT,
                                    OnImprovement as OnImprovement, YoungDaly as YoungDaly)

from ._version import __version__ as __version__

_LAZY = {
    "save": "api.saving", "load": "api.loading", "restore": "api.loading", "gc": "api.repo", "Repo": "api.repo",
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


if not TYPE_CHECKING:   # hidden from type checkers, so that a misspelt name is an error there
    __getattr__ = first_use_importer(__name__, _LAZY, _LAZY_MODULES)


def __dir__() -> list[str]:
    """The module's names, the ones imported at first use included (tab completion, ``dir()``)."""
    return sorted({*globals(), *__all__, *_LAZY_MODULES})


# spelled out (not built from _LAZY) so that type checkers read it; tests/test_typing.py checks the two agree
__all__ = ["DeltackptError", "__version__", "save", "load", "restore", "gc", "Repo", "Version", "GcReport",
           "VerifyReport", "Retention", "resume", "Checkpointer", "Guard", "SaveHandle", "EveryN", "EveryT",
           "YoungDaly", "DenseEarly", "OnImprovement", "AnyOf", "BackgroundOptions"]
