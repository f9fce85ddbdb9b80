"""One stored object (an encoded chunk): a fixed header, codec parameters, the payload.

    object = VERSION(u8) || ENCODING(u8) || PARAMS_LEN(u16 LE) || RAW_LEN(u64 LE) || PARAMS || PAYLOAD

PARAMS is a msgpack map owned by the codec (for deltas it holds the base chunk id).  The header
is repeated in the pack header and the index so reads can plan delta chains without touching
the object itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptObjectError, FormatVersionError, LimitExceededError
from . import msgpack_io
from .limits import MAX_CHUNK_BYTES, MAX_OBJECT_PARAMS_BYTES

OBJECT_VERSION = 1
_HEADER = struct.Struct("<BBHQ")
HEADER_BYTES = _HEADER.size  # 12


@dataclass(frozen=True)
class EncodedObject:
    """An encoded chunk ready to go into a pack."""

    encoding: int
    raw_len: int
    params: dict[str, Any]
    payload: bytes | memoryview

    def head(self) -> bytes:
        """Header and parameters: everything before the payload."""
        params = msgpack_io.pack(self.params) if self.params else b""
        if len(params) > MAX_OBJECT_PARAMS_BYTES:
            raise LimitExceededError(f"codec parameters of {len(params)} bytes exceed the limit")
        return _HEADER.pack(OBJECT_VERSION, self.encoding, len(params), self.raw_len) + params

    def to_bytes(self) -> bytes:
        return self.head() + self.payload


def parse(data: bytes | memoryview, *, what: str = "object") -> EncodedObject:
    """Parse an object's bytes; every field is bounds-checked against ``data`` and the limits."""
    view = memoryview(data)
    if len(view) < HEADER_BYTES:
        raise CorruptObjectError(f"{what}: {len(view)} bytes is shorter than an object header")
    version, encoding, params_len, raw_len = _HEADER.unpack_from(view, 0)
    if version != OBJECT_VERSION:
        raise FormatVersionError(f"{what}: object version {version} is not supported (this reader knows {OBJECT_VERSION})")
    if params_len > MAX_OBJECT_PARAMS_BYTES or HEADER_BYTES + params_len > len(view):
        raise CorruptObjectError(f"{what}: parameter length {params_len} runs past the object")
    if raw_len > MAX_CHUNK_BYTES:
        raise LimitExceededError(f"{what}: raw length {raw_len} exceeds the chunk limit {MAX_CHUNK_BYTES}")
    params: dict[str, Any] = {}
    if params_len:
        params = msgpack_io.unpack(view[HEADER_BYTES:HEADER_BYTES + params_len], what=f"{what} parameters",
                                   max_bytes=MAX_OBJECT_PARAMS_BYTES)
        if not isinstance(params, dict):
            raise CorruptObjectError(f"{what}: codec parameters are not a map")
    payload = view[HEADER_BYTES + params_len:]  # no copy: decoders only read it
    return EncodedObject(encoding, raw_len, params, payload)
