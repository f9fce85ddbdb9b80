"""The house's rules that import-linter cannot see: above the public API nothing reaches into a
handle's ``core``, and no module keeps settings in mutable globals."""

from __future__ import annotations

import ast
import os

from tests.conftest import ROOT

ABOVE_API = ("training", "integrations", "cli")


def _sources(*packages: str):
    for pkg in packages:
        base = os.path.join(ROOT, "deltackpt", pkg)
        for d, _, names in os.walk(base):
            for n in names:
                if n.endswith(".py"):
                    path = os.path.join(d, n)
                    with open(path) as f:
                        yield os.path.relpath(path, ROOT), ast.parse(f.read())


def test_nothing_above_the_api_reaches_into_a_handles_core():
    """training/, integrations/ and cli/ use the public API or deltackpt.api.internal, never
    ``repo.core`` (the torch-free Repository behind a handle)."""
    uses = [f"{path}:{node.lineno}" for path, tree in _sources(*ABOVE_API) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "core"]
    assert not uses, uses


def test_no_module_rebinds_a_global():
    """Settings and runtime state belong to objects a handle holds, passed down: no ``global``
    statement anywhere in the package."""
    found = [f"{path}:{node.lineno} {', '.join(node.names)}"
             for path, tree in _sources("") for node in ast.walk(tree) if isinstance(node, ast.Global)]
    assert not found, found
