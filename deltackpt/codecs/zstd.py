"""Encoding 1: byte-grouped planes, each zstd-compressed when it pays (the keyframe codec)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import ChunkContext, Codec, Encoded, Room
from .bytegroup import decode_planes, decode_planes_in_room, encode_planes_choosing, width_for


class ByteGroupZstd(Codec):
    encoding_id = 1
    name = "bg-zstd"

    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded:
        params, payload, planes = encode_planes_choosing(raw, width_for(ctx.itemsize, len(raw)), ctx.level, ctx.planes)
        return Encoded(params, payload, planes=planes)

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview, base: bytes | memoryview | None = None) -> None:
        decode_planes(params, payload, len(out), what=self.name, out=np.frombuffer(out, dtype=np.uint8))

    def decode_in_room(self, out: memoryview, params: dict[str, Any], room: Room) -> bool:
        return decode_planes_in_room(params, room, np.frombuffer(out, dtype=np.uint8), what=self.name)

    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        return decode_planes(params, payload, raw_len, what=self.name)  # type: ignore[return-value]  # any bytes-like

