"""Shared plumbing for the atheris targets.

Each target defines ``TestOneInput(data: bytes)``: it feeds ``data`` to one decoder and lets only
:class:`deltackpt.errors.DeltackptError` subclasses through as "handled".  Anything else (a
``ValueError`` from numpy, an ``IndexError``, a ``MemoryError``, a hang) is a bug and escapes, so
libFuzzer records the input as a crasher.  The same function is replayed by pytest
(tests/security/test_fuzz_corpus.py) without atheris.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deltackpt.errors import DeltackptError  # noqa: E402


def expect_typed(fn, *args, **kwargs):
    """Call ``fn``; a DeltackptError is the decoder refusing the input (fine), anything else escapes."""
    try:
        return fn(*args, **kwargs)
    except DeltackptError:
        return None


def main(test_one_input) -> None:
    """Run ``test_one_input`` under atheris with every loaded deltackpt module instrumented."""
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
