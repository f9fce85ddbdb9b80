"""Encoding 0: the bytes as they are."""

from __future__ import annotations

from typing import Any

from ..errors import CorruptObjectError
from .base import ChunkContext, Codec, Encoded


class Raw(Codec):
    encoding_id = 0
    name = "raw"

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded:
        return Encoded({}, bytes(raw))

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        if len(payload) != raw_len:
            raise CorruptObjectError(f"raw object holds {len(payload)} bytes, expected {raw_len}")
        return bytes(payload)
