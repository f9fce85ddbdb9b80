"""`make demo` on a fresh clone: the demo (training, saving, the CLI's log/du/show/diff/restore to
.safetensors/gc/verify) runs with only the core's dependencies importable.

A real core-only venv is what CI checks (.ci/run runs `make demo` on the clean clone before
`make test` installs the extras).  Here every module that only the extras bring (their packages and
everything those pull in, less what the core itself pulls in) is refused at import, in the demo's
process and in the CLI subprocesses it starts, so a core feature that reaches for an extra fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

from tests.conftest import ROOT

BLOCKER = r'''
import os, sys
# what a missing package looks like: `import x` raises ModuleNotFoundError, importlib.util.find_spec gives None
for _name in filter(None, os.environ.get("DELTACKPT_TEST_BLOCK", "").split(",")):
    sys.modules[_name] = None
'''


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _closure(names: set[str]) -> set[str]:
    """The installed distributions ``names`` need, transitively (requirements without extras or markers
    that exclude this interpreter)."""
    from packaging.requirements import Requirement
    seen: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        try:
            reqs = metadata.requires(n) or []
        except metadata.PackageNotFoundError:
            continue
        seen.add(n)
        for r in reqs:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(req.name))
    return seen


def _modules(dists: set[str]) -> set[str]:
    by_dist: dict[str, set[str]] = {}
    for mod, ds in metadata.packages_distributions().items():
        for d in ds:
            by_dist.setdefault(_name(d), set()).add(mod)
    return {m for d in dists for m in by_dist.get(d, ()) if not m.startswith("_")}


def extras_only_modules() -> tuple[set[str], set[str]]:
    """(top-level modules only the extras bring, modules the core brings), from pyproject.toml."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    core = _closure({_name(r) for r in project["dependencies"]})
    # an extra may name the project's own other extras (adapters = deltackpt[lightning,hf]): those are listed too
    extras = _closure({_name(r) for reqs in project["optional-dependencies"].values() for r in reqs} - {project["name"]})
    return _modules(extras - core), _modules(core)


def test_the_blocker_covers_the_extras():
    """The refused set holds each extra's own top-level modules and none of the core's."""
    pytest.importorskip("packaging")
    blocked, core = extras_only_modules()
    installed = set(metadata.packages_distributions())
    for m in ("pytorch_lightning", "transformers", "h5py", "s3fs", "moto", "hypothesis"):
        if m in installed:
            assert m in blocked, m
    assert {"torch", "numpy", "zstandard", "safetensors"} & installed <= core
    assert not blocked & {"torch", "numpy", "zstandard", "xxhash", "msgpack", "rich", "safetensors"}


def test_demo_runs_with_only_the_core(tmp_path):
    """examples/demo.py (what `make demo` runs) passes with every extras-only module refused at import."""
    pytest.importorskip("packaging")
    blocked, _ = extras_only_modules()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), ROOT]), "OMP_NUM_THREADS": "1",
           "DELTACKPT_TEST_BLOCK": ",".join(sorted(blocked))}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--dir", str(tmp_path),
                           "--steps", "100"], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "demo done" in proc.stdout
    assert (tmp_path / "demo-out" / "encoder.safetensors").stat().st_size > 0


MISSING = r'''
import sys
sys.modules[sys.argv[1]] = None
try:
    exec(sys.argv[2])
except ImportError as exc:
    from deltackpt.errors import MissingDependencyError
    assert isinstance(exc, MissingDependencyError), repr(exc)
    print(exc)
'''


@pytest.mark.parametrize("blocked, code, hint", [
    ("s3fs", "import deltackpt; deltackpt.Repo('s3://bucket/run1').log()", "pip install 'fsspec>=2024.2' 's3fs>=2024.2'"),
    ("lightning_fabric", "import deltackpt.integrations.lightning", "pip install 'pytorch-lightning>=2.2' 'omegaconf>=2.3'"),
    ("transformers", "import deltackpt.integrations.hf", "pip install 'transformers>=4.40' 'accelerate>=0.26'"),
])
def test_a_missing_extra_says_what_to_install(blocked, code, hint):
    """A feature whose extra is missing raises MissingDependencyError (an ImportError) naming a pip
    command that works without a package index serving deltackpt: the extra's own requirements."""
    proc = subprocess.run([sys.executable, "-c", MISSING, blocked, code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert hint in proc.stdout and len(proc.stdout.strip().splitlines()) == 1, proc.stdout


def test_cli_names_the_missing_extra_in_one_line():
    """`deltackpt log --repo s3://...` without s3fs exits with one stderr line saying what to pip install."""
    code = "import sys, runpy; sys.modules['s3fs'] = None; sys.argv = ['deltackpt', 'log', '--repo', 's3://b/r']; " \
           "runpy.run_module('deltackpt.cli.main', run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'fsspec>=2024.2' 's3fs>=2024.2' (deltackpt's [s3] extra)" in lines[0], proc.stderr
