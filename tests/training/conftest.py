"""Every guarded run a test makes is closed after it (its repository handle, the guard's holds)."""

from __future__ import annotations

import pytest

from tests.training import _guarded


@pytest.fixture(autouse=True)
def _close_guarded_runs():
    yield
    _guarded.close_all()
