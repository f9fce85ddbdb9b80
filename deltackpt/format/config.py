"""The repository config object: format name and version, checked before anything else is read.

    config = msgpack map {"format": "deltackpt", "version": 1, "repo_id": hex, "created": float,
                          "chunk_bytes": int, "keyframe_interval": int, ["delta_base": str]}

``delta_base`` says what writers take lossless deltas against: ``"parent"`` (the chunk at the same
place in the previous save: a chain, depth <= keyframe_interval; the default, written only when
different) or ``"keyframe"`` (that place's last keyframe: a star, depth <= 1).  Readers need it
not: every delta names its base.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CorruptObjectError, FormatVersionError
from . import msgpack_io
from .limits import DEFAULT_CHUNK_BYTES, DEFAULT_KEYFRAME_INTERVAL, FORMAT_VERSION, MAX_CHUNK_BYTES, MAX_CONFIG_BYTES

FORMAT_NAME = "deltackpt"
DELTA_BASES = ("parent", "keyframe")


@dataclass
class Config:
    repo_id: str
    created: float
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    keyframe_interval: int = DEFAULT_KEYFRAME_INTERVAL
    version: int = FORMAT_VERSION
    delta_base: str = "parent"

    def to_bytes(self) -> bytes:
        obj = {"format": FORMAT_NAME, "version": self.version, "repo_id": self.repo_id, "created": self.created,
               "chunk_bytes": self.chunk_bytes, "keyframe_interval": self.keyframe_interval}
        if self.delta_base != "parent":
            obj["delta_base"] = self.delta_base
        return msgpack_io.pack(obj)


def check_delta_base(value: str) -> str:
    if value not in DELTA_BASES:
        raise ValueError(f"delta_base must be one of {DELTA_BASES}, not {value!r}")
    return value


def decode(data: bytes, *, where: str) -> Config:
    obj = msgpack_io.unpack(data, what=f"config of {where}", max_bytes=MAX_CONFIG_BYTES)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise CorruptObjectError(f"{where}: config is not a deltackpt config")
    version = obj.get("version")
    if version != FORMAT_VERSION:
        raise FormatVersionError(f"{where}: repository format version {version!r} is not supported by this "
                                 f"deltackpt (it reads version {FORMAT_VERSION}); upgrade deltackpt")
    repo_id = obj.get("repo_id")
    if not isinstance(repo_id, str):
        raise CorruptObjectError(f"{where}: config lacks repo_id")
    chunk = msgpack_io.expect_int(obj.get("chunk_bytes", DEFAULT_CHUNK_BYTES), "config chunk_bytes", 1, MAX_CHUNK_BYTES)
    k = msgpack_io.expect_int(obj.get("keyframe_interval", DEFAULT_KEYFRAME_INTERVAL), "config keyframe_interval", 0, 1024)
    created = obj.get("created", 0.0)
    base = obj.get("delta_base", "parent")
    if base not in DELTA_BASES:
        raise CorruptObjectError(f"{where}: config delta_base {base!r:.40} is not one of {DELTA_BASES}")
    return Config(repo_id, float(created) if isinstance(created, (int, float)) else 0.0, chunk, k, version, base)
