"""The codec interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..errors import InvalidArgumentError

MIN_LEVEL, MAX_LEVEL = -(1 << 17), 22
"""The zstd compression levels (negative: faster, larger); zstd itself refuses anything above 22."""


def is_int(value: object) -> TypeGuard[int]:
    """An integer parameter read from a header: msgpack's ``True`` is an ``int`` to Python, never to us."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_level(value: Any) -> int:
    """``value`` if it is a zstd level writers may use, else InvalidArgumentError (found when the
    handle is opened, not at the next save, deep inside the compressor)."""
    if not is_int(value) or not MIN_LEVEL <= value <= MAX_LEVEL:
        raise InvalidArgumentError(f"compression level must be a whole number from {MIN_LEVEL} to {MAX_LEVEL} "
                                   f"(zstd's levels), got {value!r:.40}")
    return value


@dataclass(frozen=True)
class ChunkContext:
    """What a codec may know about the bytes it encodes."""

    dtype: str        # format dtype name (format/dtypes.py)
    itemsize: int
    row_bytes: int    # bytes per row of the leading dimension (0 for 0-d)
    level: int = 1    # zstd level
    planes: tuple[int, ...] | None = None  # the keyframe codec's choice per byte plane at this
    # position last time (Encoded.planes): taken without sampling again (bytegroup.compress_planes_choosing)


@dataclass(frozen=True)
class Encoded:
    """A codec's output: parameters for the object header and the payload."""

    params: dict[str, Any]
    payload: bytes | memoryview
    recon: bytes | None = None       # lossy codecs: the bytes a decoder will produce
    max_abs_err: float = 0.0
    planes: tuple[int, ...] | None = None  # the keyframe codec: what it chose for each byte plane
    # (bytegroup.PLANE_*), for the next save at this position; never stored


@dataclass(frozen=True)
class Room:
    """Scratch memory around a payload that a decoder may overwrite: ``buf[lo:hi]`` is writable
    and nobody reads it again, the payload is ``buf[start:start + length]`` inside it.  A reader
    that reads objects into a buffer of its own, spaced apart (repo/read/stream.py), offers it, so
    a codec can build its working layout where the payload already lies instead of copying it."""

    buf: memoryview
    start: int
    length: int
    lo: int
    hi: int


class Codec(ABC):
    """A frozen encoding id and its encode/decode pair.

    ``decode`` must treat ``params`` and ``payload`` as hostile: check every length against
    ``raw_len`` before allocating, and raise CorruptObjectError on anything inconsistent.
    """

    encoding_id: int
    name: str
    lossless: bool = True
    needs_base: bool = False
    invertible: bool = False   # unapply_into recovers the base from the new chunk (live rollback)

    @abstractmethod
    def encode(self, raw: bytes | memoryview, ctx: ChunkContext, base: bytes | memoryview | None = None) -> Encoded | None:
        """Encode ``raw`` (against ``base`` for delta codecs); None when the codec does not apply."""

    def decode_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview, base: bytes | memoryview | None = None) -> None:
        """Decode straight into ``out`` (its length is the raw length).  Codecs that can write
        their output in place override this to save a chunk-sized allocation and copy."""
        out[:] = memoryview(self.decode(params, payload, len(out), base)).cast("B")

    def decode_in_room(self, out: memoryview, params: dict[str, Any], room: Room) -> bool:
        """Decode a keyframe whose payload lies in ``room`` into ``out``, using the room as scratch;
        False (before anything is written anywhere) when this codec or this payload cannot, and the
        caller decodes the payload with :meth:`decode_into` instead."""
        return False

    def apply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:

        """Decode a delta whose base is what ``out`` holds now, leaving the new chunk in ``out``.
        Delta codecs override this to work in place; this fallback copies the base first."""
        self.decode_into(out, params, payload, bytes(out))

    def unapply_into(self, out: memoryview, params: dict[str, Any], payload: bytes | memoryview) -> None:
        """The inverse of :meth:`apply_into`: ``out`` holds the chunk this delta decodes to; leave
        its base there.  Only codecs with ``invertible = True`` (an exact bijection for a given
        payload) implement it: a live rollback on a forward-chained repository uses it to step
        from the newer chunk a model holds to the older one asked for."""
        raise NotImplementedError(f"{self.name} cannot be inverted")

    @abstractmethod
    def decode(self, params: dict[str, Any], payload: bytes | memoryview, raw_len: int, base: bytes | memoryview | None = None) -> bytes:
        """Reproduce exactly ``raw_len`` bytes (any bytes-like object: bytes, memoryview, uint8 array)."""
