"""What type checkers and IDEs see of the public API: the lazily imported names are the real
functions and classes (not ``Any``), ``save`` and ``load`` are typed by their flags, a wrong
argument is an error; ``dir(deltackpt)`` lists the lazy names without importing them.

The mypy test runs the real mypy, with the project's configuration, on a short file using the API.
It shares ``.mypy_cache`` with ``make test``'s ``mypy deltackpt`` (which runs first), so only that
file is checked: seconds, where a cold cache (torch's stubs) takes minutes.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap

import pytest

import deltackpt
from deltackpt.api import gc, load, restore, save
from tests.conftest import ROOT

SNIPPET = """\
import torch
import deltackpt

model = torch.nn.Linear(2, 2)
reveal_type(deltackpt.save(model, "r"))
reveal_type(deltackpt.save(model, "r", blocking=False))
reveal_type(deltackpt.load("r", return_version=True))
reveal_type(deltackpt.Repo)
reveal_type(deltackpt.resume)
with deltackpt.Repo("r") as repo:
    reveal_type(repo.save({"model": model.state_dict()}, step=1, blocking=False))
    reveal_type(repo.du()["total"]["stored_bytes"])
deltackpt.save(model, 3)
deltackpt.sav(model, "r")
"""

# line -> what mypy says there (a regular expression matched from the start of the message)
EXPECTED = {
    5: r'note: Revealed type is "deltackpt\.repo\.versions\.Version"',
    6: r'note: Revealed type is "deltackpt\.snapshot\.handle\.SaveHandle"',
    7: r'note: Revealed type is "tuple\[Any, deltackpt\.repo\.versions\.Version\]"',
    8: r'note: Revealed type is "def \(location: .*\) -> deltackpt\.api\.repo\.Repo"',   # the class
    9: r'note: Revealed type is "def \(repo: .*model: torch\.nn\.modules\.module\.Module \| None.*\) -> '
       r'deltackpt\.training\.resume\.ResumeInfo \| None"',
    11: r'note: Revealed type is "deltackpt\.snapshot\.handle\.SaveHandle"',
    12: r'note: Revealed type is "(builtins\.)?int"',
    13: r'error: No overload variant of "save" matches argument types "Linear", "int"  \[call-overload\]',
    14: r'error: Module has no attribute "sav"',
}


def test_mypy_sees_the_public_api(tmp_path):
    pytest.importorskip("mypy")
    path = tmp_path / "uses_api.py"
    path.write_text(SNIPPET)
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
                          "--cache-dir", os.path.join(ROOT, ".mypy_cache"), "--no-error-summary", str(path)],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "MYPYPATH": ROOT}, timeout=600)
    lines: dict[int, list[str]] = {}
    for line in out.stdout.splitlines():
        m = re.match(r".*uses_api\.py:(\d+): (.*)", line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    for n, want in EXPECTED.items():
        assert any(re.match(want, got) for got in lines.get(n, [])), (n, want, out.stdout, out.stderr)
    unexpected = {n: got for n, got in lines.items() if n not in EXPECTED}
    assert not unexpected, out.stdout   # the rest of the file type-checks
    assert out.returncode == 1   # the two errors above, nothing else wrong (2 would be a crash)


def test_dir_lists_the_lazy_names_without_importing_them():
    """``dir(deltackpt)`` names every public name (tab completion), and asking imports nothing."""
    script = textwrap.dedent("""
        import sys
        import deltackpt
        names = dir(deltackpt)
        missing = [n for n in [*deltackpt.__all__, "dcp"] if n not in names]
        assert not missing, missing
        assert "torch" not in sys.modules and "deltackpt.api" not in sys.modules, "dir() imported the API"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_all_is_the_lazy_table():
    """``__all__`` is spelled out for type checkers; it names exactly what ``__getattr__`` serves."""
    assert sorted(deltackpt.__all__) == sorted(["DeltackptError", "__version__", *deltackpt._LAZY])
    assert all(getattr(deltackpt, name) is not None for name in deltackpt.__all__)


@pytest.mark.parametrize("method, function, skip", [
    (deltackpt.Repo.save, save, {"repo"}), (deltackpt.Repo.load, load, {"repo"}),
    (deltackpt.Repo.restore, restore, {"repo"}), (deltackpt.Repo.gc, gc, {"repo"}),
])
def test_repo_methods_take_the_functions_parameters(method, function, skip):
    """``Repo.save`` and the others spell out the parameters of the functions they call (typed
    ones, not ``**kwargs``): the same names, kinds and defaults, so neither drifts from the other."""
    def params(f, drop):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values() if p.name not in drop]
    assert params(method, {"self"}) == params(function, skip)
