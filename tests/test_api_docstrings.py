"""The public API's docstrings are Google style, so the API reference (mkdocstrings, mkdocs.yml
``docstring_style: google``) shows Parameters, Returns and Raises sections: every parameter is
under ``Args:``, a function that returns something says what under ``Returns:``, and every
top-level function and class has an ``Example:`` (issue 33, item 5)."""

from __future__ import annotations

import dataclasses
import glob
import inspect
import os
import re

import pytest

import deltackpt
from deltackpt.training import ResumableSampler, training_state
from tests.conftest import ROOT

TOP = [deltackpt.save, deltackpt.load, deltackpt.restore, deltackpt.gc, deltackpt.resume, deltackpt.Repo,
       deltackpt.Checkpointer, deltackpt.Guard, deltackpt.Retention, deltackpt.EveryN, deltackpt.EveryT,
       deltackpt.YoungDaly, deltackpt.DenseEarly, deltackpt.OnImprovement, deltackpt.AnyOf, training_state,
       ResumableSampler]
METHODS = [getattr(cls, name) for cls, names in (
    (deltackpt.Repo, ["init", "resolve", "log", "show", "tag", "untag", "events", "drill", "verify", "rebuild_index",
                      "du", "diff", "deltify"]),
    (deltackpt.Checkpointer, ["due", "step", "prepare", "wait", "close"]),
    (deltackpt.Guard, ["attach", "saved", "check", "rollback_state"]),
) for name in names]


def _parameters(obj) -> list[str]:
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj) if f.init]
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [prefix.get(p.kind, "") + p.name for p in sig.parameters.values() if p.name not in ("self", "cls")]


def _section(doc: str, title: str) -> str | None:
    """The indented body under ``title:`` (a Google-style section), None without one."""
    m = re.search(rf"^{title}:\n((?:[ \t]+.*\n|\n)+)", doc + "\n", flags=re.M)
    return m.group(1) if m else None


@pytest.mark.parametrize("obj", TOP + METHODS, ids=lambda o: o.__qualname__)
def test_public_docstrings_have_google_sections(obj):
    doc = inspect.getdoc(obj)
    assert doc, f"{obj.__qualname__} has no docstring"
    params = _parameters(obj)
    if params:
        args = _section(doc, "Args")
        assert args is not None, f"{obj.__qualname__}: no Args: section"
        listed = re.findall(r"^    (\**\w+):", args, flags=re.M)
        assert listed == params, f"{obj.__qualname__}: Args lists {listed}, the signature has {params}"
    returns = None if inspect.isclass(obj) else inspect.signature(obj).return_annotation
    if returns not in (None, "None", inspect.Signature.empty):
        assert _section(doc, "Returns") is not None, f"{obj.__qualname__}: returns {returns} but has no Returns:"
    for title in ("Raises", "Example"):
        body = _section(doc, title)
        assert body is None or body.strip(), f"{obj.__qualname__}: an empty {title}: section"
    if obj in TOP:
        assert _section(doc, "Example") is not None, f"{obj.__qualname__}: no Example: section"
    raises = _section(doc, "Raises") or ""
    for name in re.findall(r"^    (\w+):", raises, flags=re.M):
        assert issubclass(getattr(deltackpt.errors, name), deltackpt.DeltackptError), name


def test_the_reference_renders_them_as_sections_and_wraps_long_lines():
    """mkdocs.yml parses Google style and loads the CSS that wraps signatures; every public
    function and class above is on a reference page."""
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        mkdocs = f.read()
    assert re.search(r"^\s+docstring_style: google$", mkdocs, flags=re.M)
    css = re.search(r"^extra_css:\n\s+- (\S+)", mkdocs, flags=re.M)
    assert css, "no extra_css"
    with open(os.path.join(ROOT, "docs", css.group(1)), encoding="utf-8") as f:
        assert "white-space: pre-wrap" in f.read()
    pages = "".join(open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(ROOT, "docs", "reference", "*.md")))
    documented = set(re.findall(r"^::: ([\w.]+)$", pages, flags=re.M))
    for obj in TOP:
        assert f"{obj.__module__}.{obj.__qualname__}" in documented, obj.__qualname__
