"""Import paths from before the frontend was split into packages, kept working.

``import deltackpt.frontend.adapters.lightning`` gives :mod:`deltackpt.integrations.lightning`
itself: the same module object, so a setting made through the old name
(``deltackpt.frontend.async_save.BACKGROUND = "process"``) is the one the library reads.  Each
old name warns once with a DeprecationWarning naming the new one.  Nothing in deltackpt imports
this package (import-linter forbids it); it exists for code written against those paths.

Example::

    from deltackpt.frontend.adapters.hf import DeltackptCallback   # same as the line below
    from deltackpt.integrations.hf import DeltackptCallback
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

MOVED = {
    "api": "deltackpt.api", "restore": "deltackpt.api.loading",
    "flatten": "deltackpt.torchstate.flatten", "tensor_bytes": "deltackpt.torchstate.tensor_bytes",
    "dtypes": "deltackpt.torchstate.dtypes", "planner": "deltackpt.torchstate.planner",
    "materialize": "deltackpt.torchstate.materialize", "diff": "deltackpt.torchstate.diff",
    "priority": "deltackpt.priority",
    "async_save": "deltackpt.snapshot.async_save", "staging": "deltackpt.snapshot.staging",
    "lazy": "deltackpt.snapshot.lazy", "prefault": "deltackpt.snapshot.prefault",
    "training": "deltackpt.training", "policies": "deltackpt.training.policies", "rng": "deltackpt.training.rng",
    "dcp": "deltackpt.integrations.dcp", "files": "deltackpt.integrations.files",
    "adapters": "deltackpt.integrations", "adapters.lightning": "deltackpt.integrations.lightning",
    "adapters.hf": "deltackpt.integrations.hf", "adapters.plain": "deltackpt.integrations.plain",
}
"""Old name (under ``deltackpt.frontend``) -> the module it now is."""


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``deltackpt.frontend.<old>`` and hands back the moved module object itself."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        old = fullname[len(__name__) + 1:] if fullname.startswith(__name__ + ".") else None
        if old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=old == "adapters")

    def create_module(self, spec: Any) -> ModuleType:
        new = MOVED[spec.name[len(__name__) + 1:]]
        warnings.warn(f"{spec.name} is now {new}", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


if not any(isinstance(f, _OldNames) for f in sys.meta_path):
    sys.meta_path.insert(0, _OldNames())
