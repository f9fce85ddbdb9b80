"""Fixtures of the reliability tests; the harness itself is harness.py (see tests/RELIABILITY.md)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Zygote  # noqa: E402


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    """The child.py fork server shared by every test of the session."""
    z = Zygote(str(tmp_path_factory.mktemp("jobs")))
    yield z
    z.close()
