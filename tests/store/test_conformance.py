"""Every store passes StoreSuite: local disk, memory, the counting and caching wrappers, and
FsspecStore over a real S3 server (moto on loopback) and over fsspec's in-memory filesystem."""

from __future__ import annotations

import secrets

import pytest

from deltackpt.store import CachedStore, CountingStore, FsspecStore, LocalStore, MemoryStore, ReadCache

from .suite import StoreSuite


class TestLocalStore(StoreSuite):
    @pytest.fixture
    def store(self, tmp_path):
        return LocalStore(tmp_path / "repo")


class TestMemoryStore(StoreSuite):
    @pytest.fixture
    def store(self):
        return MemoryStore()


class TestCountingStore(StoreSuite):
    @pytest.fixture
    def store(self):
        return CountingStore(MemoryStore())


class TestCachedLocalStore(StoreSuite):
    @pytest.fixture
    def store(self, tmp_path):
        return CachedStore(LocalStore(tmp_path / "repo"), ReadCache(tmp_path / "cache", 1 << 20))


class TestFsspecS3(StoreSuite):
    @pytest.fixture
    def store(self, s3_url):
        return FsspecStore(s3_url, cache_dir=False)

    def test_capabilities_are_truthful(self, store):
        """On S3 put_if_absent and swap are conditional PUTs (atomic) and writes are durable on return."""
        assert store.atomic_create and store.atomic_swap and store.durable


@pytest.mark.slow
class TestFsspecS3Cached(StoreSuite):
    @pytest.fixture
    def store(self, s3_url, tmp_path):
        return FsspecStore(s3_url, cache_dir=tmp_path / "cache", cache_bytes=1 << 20)


class TestFsspecMemory(StoreSuite):
    @pytest.fixture
    def store(self):
        return FsspecStore(f"memory://dk-{secrets.token_hex(6)}/repo", cache_dir=False)

    def test_capabilities_are_truthful(self, store):
        """fsspec's memory filesystem has no conditional create and no durability; the flags say so."""
        assert not store.atomic_create and not store.durable
