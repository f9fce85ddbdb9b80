"""Optional dependencies: import one, or say in one line what to install.

The core (``pip install .`` in a clone, or the wheel ``make package`` builds) saves, loads, exports
``.safetensors`` and runs the CLI on local repositories.  Object stores and the framework adapters
need extras; a feature that needs a missing one raises
:class:`~deltackpt.errors.MissingDependencyError` naming the exact command, with the extra's
packages spelt out (deltackpt is on no package index, so ``pip install 'deltackpt[s3]'`` would not
find it).

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
    """The pip command that installs ``module`` (top-level name): for an extra's module, the
    extra's requirements as the installed package's metadata lists them."""
    top = module.split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return f"pip install {PACKAGES.get(top, top)}"
    reqs = _extra_requirements(extra) or sorted(PACKAGES.get(m, m) for m, e in EXTRAS.items() if e == extra)
    return f"pip install {' '.join(repr(r) for r in reqs)} (deltackpt's [{extra}] extra)"


def _extra_requirements(extra: str) -> list[str]:
    """The requirements ``extra`` adds (``["fsspec>=2024.2", ...]``), from the installed metadata;
    [] when deltackpt runs from a source tree that was never installed."""
    from importlib import metadata

    try:
        requires = metadata.requires("deltackpt") or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for req in requires:
        spec, _, marker = req.partition(";")
        if marker.replace("'", '"').split() == ["extra", "==", f'"{extra}"']:
            out.append(spec.strip().replace(" ", ""))
    return out


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
