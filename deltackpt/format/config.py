"""The repository config object: format name and version, checked before anything else is read.

    config = msgpack map {"format": "deltackpt", "version": 1 | 2 | 3, "repo_id": hex, "created": float,
                          "chunk_bytes": int, "keyframe_interval": int, ["delta_base": str]}

Format 3 differs from format 2 only in its index files (version 2, spec §8).

``delta_base`` says what writers take lossless deltas against: ``"child"`` (formats 2 and 3, their
default: a save writes a changed chunk whole or as a small forward delta, so the newest version is
about one read away, and older versions become deltas against newer chunks later, spec §10),
``"parent"`` (the chunk at the same place in
the previous save: a forward chain, depth <= keyframe_interval; format 1's default, written only
when different there) or ``"keyframe"`` (that place's last keyframe: a star, depth <= 1).  Readers
need it not: every delta names its base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from ..errors import CorruptObjectError, FormatVersionError, InvalidArgumentError
from . import msgpack_io
from .limits import (DEFAULT_CHUNK_BYTES, DEFAULT_KEYFRAME_INTERVAL, FORMAT_VERSION, MAX_CHUNK_BYTES, MAX_CONFIG_BYTES,
                     MAX_KEYFRAME_INTERVAL, READABLE_VERSIONS)

FORMAT_NAME = "deltackpt"
DELTA_BASES = ("child", "parent", "keyframe")


@dataclass
class Config:
    repo_id: str
    created: float
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    keyframe_interval: int = DEFAULT_KEYFRAME_INTERVAL
    version: int = FORMAT_VERSION
    delta_base: str = "child"

    def to_bytes(self) -> bytes:
        obj = {"format": FORMAT_NAME, "version": self.version, "repo_id": self.repo_id, "created": self.created,
               "chunk_bytes": self.chunk_bytes, "keyframe_interval": self.keyframe_interval}
        if self.version >= 2 or self.delta_base != "parent":
            obj["delta_base"] = self.delta_base
        return msgpack_io.pack(obj)


def default_delta_base(version: int) -> str:
    return "parent" if version < 2 else "child"


def check_delta_base(value: str, version: int = FORMAT_VERSION) -> str:
    """``value`` if a writer of a format-``version`` repository may use it, else InvalidArgumentError."""
    if value not in DELTA_BASES:
        raise InvalidArgumentError(f"delta_base must be one of {DELTA_BASES}, not {value!r}")
    if value == "child" and version < 2:
        raise InvalidArgumentError("delta_base 'child' needs a format-2 or newer repository; this one is format "
                                   f"{version} (its readers would not follow reverse deltas)")
    return value


def _whole(value: object, lo: int, hi: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def check_chunk_bytes(value: object) -> int:
    """``value`` if a writer may use it as the target chunk size (what :func:`decode` accepts),
    else InvalidArgumentError: a config holding it could not be read back."""
    if not _whole(value, 1, MAX_CHUNK_BYTES):
        raise InvalidArgumentError(f"chunk size (chunk_bytes, --chunk-bytes) must be a whole number of bytes from 1 "
                                   f"to {MAX_CHUNK_BYTES} (64 MiB), got {value!r:.40}")
    return value


def check_keyframe_interval(value: object) -> int:
    """``value`` if a writer may use it as the keyframe interval, else InvalidArgumentError."""
    if not _whole(value, 0, MAX_KEYFRAME_INTERVAL):
        raise InvalidArgumentError(f"keyframe interval (keyframe_interval, --keyframe-interval) must be a whole "
                                   f"number from 0 to {MAX_KEYFRAME_INTERVAL}, got {value!r:.40}")
    return value


def check_overrides(chunk_bytes: object, keyframe_interval: object, delta_base: str | None, version: int) -> None:
    """Refuse a writer's overrides of a format-``version`` repository's settings (None: the
    repository's own), with InvalidArgumentError."""
    if chunk_bytes is not None:
        check_chunk_bytes(chunk_bytes)
    if keyframe_interval is not None:
        check_keyframe_interval(keyframe_interval)
    if delta_base is not None:
        check_delta_base(delta_base, version)


def decode(data: bytes, *, where: str) -> Config:
    """The config in ``data``, checked in this order (spec §4; the first failing check is the
    error): size, a msgpack map, ``format``, ``version``, ``repo_id``, ``chunk_bytes``,
    ``keyframe_interval``, ``delta_base``; ``created`` that is no number reads as 0."""
    obj = msgpack_io.unpack(data, what=f"config of {where}", max_bytes=MAX_CONFIG_BYTES)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise CorruptObjectError(f"{where}: config is not a deltackpt config")
    version = obj.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise FormatVersionError(f"{where}: repository format version {version!r:.20} is not supported by this "
                                 f"deltackpt (it reads versions {', '.join(map(str, READABLE_VERSIONS))}); "
                                 "upgrade deltackpt")
    repo_id = obj.get("repo_id")
    if not isinstance(repo_id, str):
        raise CorruptObjectError(f"{where}: config lacks repo_id")
    chunk = msgpack_io.expect_int(obj.get("chunk_bytes", DEFAULT_CHUNK_BYTES), "config chunk_bytes", 1, MAX_CHUNK_BYTES)
    k = msgpack_io.expect_int(obj.get("keyframe_interval", DEFAULT_KEYFRAME_INTERVAL), "config keyframe_interval", 0,
                              MAX_KEYFRAME_INTERVAL)
    created = obj.get("created", 0.0)
    base = obj.get("delta_base", default_delta_base(version))
    if base not in DELTA_BASES or (base == "child" and version < 2):
        raise CorruptObjectError(f"{where}: config delta_base {base!r:.40} is not one of {DELTA_BASES}")
    return Config(repo_id, float(created) if isinstance(created, (int, float)) else 0.0, chunk, k, version, base)
