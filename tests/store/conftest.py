"""Fixtures for the store tests: one S3 server per session, a fresh bucket per test."""

from __future__ import annotations

import pytest

from .s3server import S3Server


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on a free loopback port, for the whole session."""
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_url(s3_server):
    """``s3://<fresh bucket>/run1``: an empty repository location on the real server, emptied
    after the test: the server runs in this process and spools large objects to temp files,
    which the suite's check for files left open would otherwise blame on the test."""
    s3_server.clear_fs_cache()
    yield f"s3://{s3_server.bucket()}/run1"
    s3_server.reset()
