"""Code written against the module paths from before the frontend was split keeps working."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = r"""
import importlib, warnings
import deltackpt.frontend as old
for name, new in old.MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module("deltackpt.frontend." + name)
    assert module is importlib.import_module(new), (name, module, new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), (name, caught)
from deltackpt.frontend.adapters.lightning import DeltackptIO
from deltackpt.frontend.adapters.hf import DeltackptCallback, checkout
from deltackpt.frontend.training import Checkpointer, ResumableSampler, resume, training_state
from deltackpt.frontend.policies import EveryN
import deltackpt.frontend.async_save, deltackpt.snapshot.async_save
deltackpt.frontend.async_save.BACKGROUND = "process"
assert deltackpt.snapshot.async_save.BACKGROUND == "process"   # one module, one setting
print("ok", len(old.MOVED))
"""


def test_every_old_frontend_path_is_the_moved_module_itself():
    """Each ``deltackpt.frontend.<old>`` imports as the moved module object (so settings made
    through it are the library's), warns naming the new path, and the documented names import."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]
