"""StoreSuite: the conformance tests every Store passes.  A backend's test module subclasses it
and provides a ``store`` fixture; nothing here knows which backend it runs on."""

from __future__ import annotations

import threading

import pytest

from deltackpt.errors import LimitExceededError, ObjectNotFoundError, StoreError


def _race(n: int, attempt) -> list[int]:
    """Run ``attempt(i)`` in ``n`` threads released at once; the i's whose attempt returned True."""
    wins: list[int] = []
    barrier = threading.Barrier(n)

    def go(i: int) -> None:
        barrier.wait()
        if attempt(i):
            wins.append(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins


class StoreSuite:
    """Subclasses define a ``store`` fixture returning an empty store."""

    def test_put_get_roundtrip(self, store):
        """A value put atomically reads back byte for byte, whole."""
        data = bytes(range(256)) * 40
        store.put_atomic("packs/ab/abc", data)
        assert store.get("packs/ab/abc") == data
        assert store.size("packs/ab/abc") == len(data)

    def test_ranged_get(self, store):
        """get(start, length) returns exactly that slice, including at the edges and empty ranges."""
        data = bytes(range(256)) * 4
        store.put_atomic("obj", data)
        assert store.get("obj", 10, 20) == data[10:30]
        assert store.get("obj", 1000, 24) == data[1000:]
        assert store.get("obj", 0, 0) == b""
        assert store.get("obj", 5) == data[5:]

    def test_read_into_fills_a_caller_buffer(self, store):
        """read_into copies the range into the caller's buffer and says how much it got: all of
        it inside the value, fewer at its end; an absent key is ObjectNotFoundError.
        prefetch is only a hint: it never raises, not even for an absent key."""
        data = bytes(range(256)) * 4
        store.put_atomic("packs/ab/abd", data)
        buf = bytearray(b"\xee" * 40)
        assert store.read_into("packs/ab/abd", 10, memoryview(buf)[:20]) == 20
        assert buf[:20] == data[10:30] and buf[20:] == b"\xee" * 20
        assert store.read_into("packs/ab/abd", 1000, memoryview(buf)) == 24 and buf[:24] == data[1000:]
        with pytest.raises(ObjectNotFoundError):
            store.read_into("packs/ab/none", 0, memoryview(buf))
        store.prefetch("packs/ab/abd", 0, 1 << 20)
        store.prefetch("packs/ab/none", 0, 10)

    def test_missing_key_is_object_not_found(self, store):
        """Reading, sizing or ranged-reading an absent key raises ObjectNotFoundError (a FileNotFoundError)."""
        for call in (lambda: store.get("nope"), lambda: store.size("nope"), lambda: store.get("nope", 2, 3)):
            with pytest.raises(ObjectNotFoundError):
                call()
        assert not store.exists("nope")

    def test_put_atomic_replaces(self, store):
        """put_atomic on an existing key replaces its whole value."""
        store.put_atomic("refs/latest", b"a" * 100)
        store.put_atomic("refs/latest", b"b" * 10)
        assert store.get("refs/latest") == b"b" * 10

    def test_put_if_absent_creates_once(self, store):
        """put_if_absent creates a missing key and refuses (False, value kept) when it exists."""
        assert store.put_if_absent("locks/refs", b"first")
        assert not store.put_if_absent("locks/refs", b"second")
        assert store.get("locks/refs") == b"first"

    def test_put_if_absent_race_has_one_winner(self, store):
        """Of eight threads racing put_if_absent on one key, exactly one wins and its bytes are stored."""
        if not store.atomic_create:
            pytest.skip("this backend documents no atomic create")
        wins = _race(8, lambda i: store.put_if_absent("locks/race", b"%d" % i))
        assert len(wins) == 1
        assert store.get("locks/race") == b"%d" % wins[0]

    def test_swap_compares_then_replaces(self, store):
        """swap replaces a value only when it equals the expected one (None: only when absent), and
        a refused swap leaves the value as it was."""
        assert store.swap("refs/latest", None, b"v1\n")
        assert not store.swap("refs/latest", None, b"v2\n")
        assert not store.swap("refs/latest", b"other\n", b"v2\n")
        assert store.get("refs/latest") == b"v1\n"
        assert store.swap("refs/latest", b"v1\n", b"v2\n")
        assert store.get("refs/latest") == b"v2\n"
        assert not store.swap("refs/gone", b"v1\n", b"v2\n")
        assert not store.exists("refs/gone")

    def test_swap_race_has_one_winner(self, store):
        """Of eight threads swapping the same expected value at once, exactly one wins, where the
        backend says its swap is atomic."""
        if not store.atomic_swap:
            pytest.skip("this backend's swap is atomic only under the refs lock")
        store.put_atomic("refs/latest", b"base\n")
        wins = _race(8, lambda i: store.swap("refs/latest", b"base\n", b"%d\n" % i))
        assert len(wins) == 1
        assert store.get("refs/latest") == b"%d\n" % wins[0]

    def test_list_prefix_sorted(self, store):
        """list(prefix) returns every key under the prefix, sorted, and nothing outside it."""
        for key in ("index/b", "index/a", "packs/00/x", "packs/01/y", "indexer"):
            store.put_atomic(key, b"v")
        assert store.list("index/") == ["index/a", "index/b"]
        assert store.list("packs/") == ["packs/00/x", "packs/01/y"]
        assert store.list("refs/") == []

    def test_delete_is_idempotent(self, store):
        """delete removes a key, and deleting an absent key is not an error."""
        store.put_atomic("manifests/m", b"x")
        store.delete("manifests/m")
        store.delete("manifests/m")
        assert not store.exists("manifests/m")
        assert store.list("manifests/") == []

    def test_mtime_is_recent(self, store):
        """mtime of a fresh key is a unix time within a minute of now (grace periods rely on it)."""
        import time
        store.put_atomic("k", b"x")
        assert abs(store.mtime("k") - time.time()) < 60

    def test_get_bounded_refuses_past_the_limit(self, store):
        """get_bounded returns a value of at most max_bytes whole (twice: a cache must not change it),
        raises LimitExceededError above, and ObjectNotFoundError when absent."""
        data = bytes(range(256)) * 4
        store.put_atomic("manifests/m", data)
        for _ in range(2):
            assert store.get_bounded("manifests/m", len(data)) == data
            with pytest.raises(LimitExceededError, match="manifests/m"):
                store.get_bounded("manifests/m", len(data) - 1)
        assert store.get_bounded("manifests/m", 1 << 40) == data
        with pytest.raises(ObjectNotFoundError):
            store.get_bounded("manifests/nope", 10)

    def test_invalid_keys_refused(self, store):
        """Keys with '..', absolute paths, empty parts or a final newline are refused with StoreError
        before any I/O."""
        for key in ("../x", "/abs", "a//b", "a/../b", "", "config\n", "packs/ab/x\n"):
            with pytest.raises(StoreError):
                store.put_atomic(key, b"x")

    def test_streaming_writer_commit_and_abort(self, store):
        """A writer's bytes appear only on commit, under the key given then; an aborted writer leaves no key."""
        w = store.writer(site="pack")
        w.write(b"abc")
        w.write(memoryview(b"def"))
        assert store.list("packs/") == []
        w.commit("packs/aa/aa1")
        assert store.get("packs/aa/aa1") == b"abcdef"
        w2 = store.writer(site="pack")
        w2.write(b"zzz")
        w2.abort()
        assert store.list("packs/") == ["packs/aa/aa1"]

    def test_binary_values_and_empty_value(self, store):
        """Arbitrary bytes (NULs, high bytes) and the empty value are stored exactly."""
        store.put_atomic("a", b"\x00\xff" * 3)
        store.put_atomic("b", b"")
        assert store.get("a") == b"\x00\xff" * 3
        assert store.get("b") == b""
        assert store.size("b") == 0
