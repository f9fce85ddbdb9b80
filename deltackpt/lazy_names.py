"""A package's public names imported at first use (PEP 562), so that importing the package, or
using one of its names, does not import the modules behind the others.

Example::

    if not TYPE_CHECKING:
        __getattr__ = first_use_importer(__name__, {"load": "loading", "save": "saving"})
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Collection, Mapping


def first_use_importer(package: str, names: Mapping[str, str],
                       submodules: Collection[str] = ()) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``names`` is imported from the
    submodule it maps to when first asked for, then bound on the package (the next lookup is an
    ordinary attribute); each of ``submodules`` is imported as itself."""
    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f".{name}", package)   # the import binds it as an attribute
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__
