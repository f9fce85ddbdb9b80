"""Optional dependencies: import one, or say in one line what to install.

The core (``pip install deltackpt``) saves, loads, exports ``.safetensors`` and runs the CLI on
local repositories.  Object stores and the framework adapters need extras; a feature that needs a
missing one raises :class:`~deltackpt.errors.MissingDependencyError` naming the exact command.

Example::

    fsspec = require("fsspec", feature="s3:// repositories")
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

#: top-level module -> the extra that installs it
EXTRAS = {"fsspec": "s3", "s3fs": "s3", "lightning_fabric": "lightning", "pytorch_lightning": "lightning",
          "omegaconf": "lightning", "transformers": "hf", "accelerate": "hf"}
#: top-level module -> its name on the package index, where the two differ
PACKAGES = {"pytorch_lightning": "pytorch-lightning", "lightning_fabric": "pytorch-lightning"}


def install_hint(module: str) -> str:
    """The pip command that installs ``module`` (top-level name)."""
    top = module.split(".")[0]
    extra = EXTRAS.get(top)
    return f"pip install 'deltackpt[{extra}]'" if extra else f"pip install {PACKAGES.get(top, top)}"


def require(module: str, *, feature: str) -> ModuleType:
    """Import ``module``; if its package is missing, raise MissingDependencyError saying what to install.

    An ImportError from inside an installed package (a broken install) is raised as it is: the
    hint would be wrong there."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != top:
            raise
        raise MissingDependencyError(f"{feature} needs the {top} package, which is not installed: "
                                     f"{install_hint(top)}", name=top) from None
