"""A repository in object storage (``s3://``, ``gs://``, ``az://``, ``memory://``...) through fsspec.

Every key is one plain object under the URL's prefix; the repository format is the same as on a
local disk.  What each operation maps to, and what is guaranteed per backend, is in
spec/OBJECT_STORES.md:

- ``get`` with a range is one ranged GET (``fs.cat_file(path, start, end)``);
- ``put_atomic`` is one PUT (S3 makes a PUT visible whole or not at all, and durable on return);
- ``put_if_absent`` is a conditional PUT (``If-None-Match: *``) where the backend has one
  (:data:`CONDITIONAL_PROTOCOLS`); elsewhere it is check-then-put and ``atomic_create`` is False,
  so two processes must not commit to the same repository at the same time there;
- ``swap`` (how refs move) is a conditional PUT (``If-Match: <ETag>``) on the same backends, so a
  writer whose refs lock was broken cannot overwrite another writer's ``latest``.

Reads of immutable keys (packs, index files, manifests) go through an optional local
:class:`~deltackpt.store.cache.ReadCache`, so a rollback does not download the same bytes twice.

Example::

    store = FsspecStore("s3://bucket/run1", endpoint_url="http://127.0.0.1:5000")
    deltackpt.save(model, store)
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any, Literal

from .. import faults
from ..deps import install_hint, require
from ..errors import MissingDependencyError, ObjectNotFoundError, StoreError
from .base import Store, check_key
from .cache import ReadCache, cacheable, check_bound

#: protocols whose ``pipe_file(mode="create")`` is an atomic conditional create (If-None-Match)
CONDITIONAL_PROTOCOLS = frozenset({"s3", "s3a"})
#: protocols whose writes are durable once the call returns (the service acknowledged them)
DURABLE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
#: S3 refuses single PUTs above 5 GiB; below it we never split, so a put is one request
_SINGLE_PUT_LIMIT = 5 << 30
_CONFLICT_RETRIES = 8


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto[0] if isinstance(proto, (tuple, list)) else str(proto)


class FsspecStore(Store):
    """A :class:`Store` over any fsspec filesystem URL.

    ``cache_dir`` / ``cache_bytes`` configure the local read cache (default: the
    ``DELTACKPT_CACHE_DIR`` environment variable, off when unset; ``cache_dir=False`` turns it
    off).  Other keyword arguments go to fsspec (``endpoint_url``, ``key``, ``anon``...).
    """

    def __init__(self, url: str, *, cache_dir: "str | os.PathLike[str] | Literal[False] | None" = None,
                 cache_bytes: int | None = None, **storage_options: Any) -> None:
        fsspec = require("fsspec", feature=f"the repository {url}")  # only object-store users need it

        self.url = url.rstrip("/")
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **storage_options)
        except ImportError as exc:  # fsspec knows the protocol, its implementation is not installed
            proto = self.url.split("://", 1)[0]
            hint = install_hint("s3fs") if proto in ("s3", "s3a") else f"({exc})"
            raise MissingDependencyError(f"the repository {url} needs fsspec's {proto}:// support: {hint}",
                                         name=proto) from None
        except ValueError as exc:
            raise StoreError(errno.EINVAL, f"{url}: cannot open this URL with fsspec ({exc})") from None
        self.root = root.rstrip("/")
        self.protocol = _protocol(self.fs)
        self.atomic_create = self.protocol in CONDITIONAL_PROTOCOLS
        self.atomic_swap = self.atomic_create
        self.durable = self.protocol in DURABLE_PROTOCOLS
        if cache_dir is None:
            cache_dir = os.environ.get("DELTACKPT_CACHE_DIR") or None
        if cache_bytes is None:
            cache_bytes = int(os.environ.get("DELTACKPT_CACHE_BYTES", 2 << 30))
        self.cache: ReadCache | None = None
        if cache_dir:
            self.cache = ReadCache(os.path.join(os.fspath(cache_dir), ReadCache.namespace(self.url)), cache_bytes)

    def describe(self) -> str:
        return self.url

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def _error(self, exc: Exception, action: str, key: str) -> StoreError:
        if isinstance(exc, FileNotFoundError) and action != "write":  # a write's is a missing folder
            return ObjectNotFoundError(f"{action} {key!r} in {self.url}: no such object")
        code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
        return StoreError(code, f"{action} {key!r} in {self.url} failed: {type(exc).__name__}: {exc}")

    # reads -------------------------------------------------------------------------------
    def _fetch(self, key: str, start: int, length: int | None) -> bytes:
        path = self._path(key)
        try:
            if start == 0 and length is None:
                return bytes(self.fs.cat_file(path))
            if length == 0:
                self.size(key)  # absent keys still raise
                return b""
            end = None if length is None else start + length
            return bytes(self.fs.cat_file(path, start=start, end=end))
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - every backend has its own error types
            raise self._error(exc, "read", key) from None

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if self.cache is not None and cacheable(key):
            return self.cache.get(key, start, length, self._fetch)
        return self._fetch(key, start, length)

    def get_bounded(self, key: str, max_bytes: int) -> bytes:
        """One ranged GET of ``max_bytes + 1`` bytes: the object whole, or LimitExceededError."""
        def fetch(k: str, _start: int, _length: "int | None") -> bytes:
            return check_bound(k, max_bytes, self._fetch(k, 0, max_bytes + 1))

        if self.cache is not None and cacheable(key):  # a cached entry is checked against this limit too
            return check_bound(key, max_bytes, self.cache.get(key, 0, None, fetch))
        return fetch(key, 0, None)

    def _info(self, key: str) -> dict:
        path = self._path(key)
        try:
            self.fs.invalidate_cache(path)
            info = self.fs.info(path)
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "stat", key) from None
        if info.get("type") == "directory":
            raise ObjectNotFoundError(f"stat {key!r} in {self.url}: a prefix, not an object")
        return info

    def size(self, key: str) -> int:
        return int(self._info(key)["size"])

    def mtime(self, key: str) -> float:
        info = self._info(key)
        for name in ("LastModified", "mtime", "last_modified", "updated", "created"):
            value = info.get(name)
            if value is None:
                continue
            if hasattr(value, "timestamp"):
                return float(value.timestamp())
            if isinstance(value, (int, float)):
                return float(value)
        try:
            return float(self.fs.modified(self._path(key)).timestamp())
        except Exception:  # noqa: BLE001 - backends without mtimes: treat as just written
            return time.time()

    def list(self, prefix: str) -> list[str]:
        base = f"{self.root}/{prefix.rstrip('/')}" if prefix.strip("/") else self.root
        try:
            self.fs.invalidate_cache(base)
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "list", prefix) from None
        cut = len(self.root) + 1
        out = []
        for path in found:
            path = self.fs._strip_protocol(path) if "://" in path else path
            key = path[cut:] if path.startswith(self.root + "/") else None
            if key and key.startswith(prefix):
                out.append(key)
        return sorted(out)

    # writes ------------------------------------------------------------------------------
    def _put(self, key: str, data: bytes, site: str, mode: str, **conditions: str) -> None:
        if len(data) > _SINGLE_PUT_LIMIT:
            raise StoreError(errno.EFBIG, f"{key!r}: {len(data)} bytes exceed one PUT ({_SINGLE_PUT_LIMIT})")
        short = faults.hit(f"{site}.write")
        if short:
            raise StoreError(errno.EIO, f"injected short write at {site}.write (an upload that failed midway)")
        kwargs: dict[str, Any] = {"mode": mode, **conditions}
        if self.protocol in ("s3", "s3a"):
            kwargs["chunksize"] = _SINGLE_PUT_LIMIT  # one PUT, never a multipart upload
        self.fs.pipe_file(self._path(key), bytes(data), **kwargs)

    def put_atomic(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> None:
        try:
            self._put(key, data, site, "overwrite")
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "write", key) from None

    def put_if_absent(self, key: str, data: bytes, *, site: str = "object", durable: bool = True) -> bool:
        path = self._path(key)
        if not self.atomic_create:
            # no conditional write on this backend: check, then put (see spec/OBJECT_STORES.md)
            if self.exists(key):
                return False
            self.put_atomic(key, data, site=site)
            return True
        for attempt in range(_CONFLICT_RETRIES):
            try:
                self._put(key, data, site, "create")
                return True
            except FileExistsError:
                return False
            except StoreError:
                raise
            except OSError as exc:
                # 412 without a condition name, or 409 (a conditional write to the key in flight):
                # whichever it was, the object's presence decides
                if exc.errno not in (errno.EINVAL, errno.EBUSY):
                    raise self._error(exc, "write", key) from None
                self.fs.invalidate_cache(path)
                if self.exists(key):
                    return False
                time.sleep(0.01 * (attempt + 1))
            except Exception as exc:  # noqa: BLE001
                raise self._error(exc, "write", key) from None
        raise StoreError(errno.EBUSY, f"create {key!r} in {self.url}: kept conflicting with other writers")

    def swap(self, key: str, expected: bytes | None, data: bytes, *, site: str = "object") -> bool:
        if not self.atomic_swap:
            return super().swap(key, expected, data, site=site)
        if expected is None:
            return self.put_if_absent(key, data, site=site)
        # the ETag is read before the value: if the object changes in between, the PUT's
        # If-Match fails and we answer False, never a swap against a value we did not compare
        try:
            etag = self._info(key).get("ETag")
            current = self._fetch(key, 0, len(expected) + 1)  # never a huge (hostile) object whole
        except ObjectNotFoundError:
            return False
        if current != expected:
            return False
        if not etag:
            raise StoreError(errno.ENOTSUP, f"swap {key!r} in {self.url}: the backend returned no ETag")
        try:
            self._put(key, data, site, "overwrite", IfMatch=etag)
            return True
        except StoreError:
            raise
        except FileNotFoundError:
            return False  # deleted since we read it
        except OSError as exc:
            # 412 (the ETag moved on) or 409 (a conditional write to the key in flight): lost
            if exc.errno in (errno.EINVAL, errno.EBUSY):
                return False
            raise self._error(exc, "write", key) from None
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "write", key) from None
        finally:
            self.fs.invalidate_cache(self._path(key))

    def delete(self, key: str, *, site: str = "delete") -> None:
        path = self._path(key)
        faults.hit(site)
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "delete", key) from None
        finally:
            self.fs.invalidate_cache(path)
        if self.cache is not None and cacheable(key):
            self.cache.forget(key)
