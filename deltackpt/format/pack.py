"""Pack files: many objects in one file, self-describing so the index can be rebuilt from packs.

    pack    = MAGIC(8) || object_0 || ... || object_n-1 || HEADER || TRAILER
    HEADER  = msgpack array of entries [id(bin16), offset, length, encoding, raw_len, base(bin16|nil), depth]
    TRAILER = HEADER_LEN(u32 LE) || HEADER_XXH64(u64 LE) || END_MAGIC(8)

The header sits at the end, after the objects, so a writer streams objects without knowing their
number in advance (restic does the same).  A reader fetches the 20-byte trailer, then the header.
"""

from __future__ import annotations

import struct
from typing import Callable, NamedTuple

import xxhash

from ..errors import CorruptObjectError, FormatVersionError, LimitExceededError
from . import msgpack_io
from .ids import ID_BYTES, check_raw_id
from .limits import MAX_CHAIN_DEPTH, MAX_CHUNK_BYTES, MAX_PACK_BYTES, MAX_PACK_HEADER_BYTES

MAGIC = b"DCKPACK\x01"
END_MAGIC = b"DCKPEND\x01"
_TRAILER = struct.Struct("<IQ8s")
TRAILER_BYTES = _TRAILER.size  # 20
MIN_PACK_BYTES = len(MAGIC) + TRAILER_BYTES


class PackEntry(NamedTuple):
    """Where one object lives and how to plan its decoding.  A named tuple: opening a repository
    makes one per stored copy, and a frozen dataclass cost about 2 us each to build (a
    300-version history's index: 120 of the 190 ms its decoding took)."""

    chunk_id: bytes
    offset: int
    length: int
    encoding: int
    raw_len: int
    base: bytes | None
    depth: int

    def to_list(self) -> list:
        return [self.chunk_id, self.offset, self.length, self.encoding, self.raw_len, self.base, self.depth]

    @classmethod
    def from_list(cls, item: object, *, what: str, pack_len: int | None = None) -> "PackEntry":
        """An entry read from a pack header or an index file, schema-checked (CorruptObjectError
        naming ``what``); ``pack_len``: the object must lie inside a pack that long."""
        # the common case checked inline, with no message built: opening a repository decodes
        # every entry of its index (a 300-version history: 60,000, which took 190 ms); anything
        # unusual takes the checked path below, which names what is wrong
        if type(item) is list and len(item) == 7:
            cid, offset, length, encoding, raw_len, base, depth = item
            if (type(cid) is bytes and len(cid) == ID_BYTES and type(offset) is int and type(length) is int
                    and type(encoding) is int and type(raw_len) is int and type(depth) is int
                    and 0 <= offset <= MAX_PACK_BYTES and 12 <= length <= MAX_CHUNK_BYTES * 2
                    and 0 <= encoding <= 255 and 0 <= raw_len <= MAX_CHUNK_BYTES
                    and ((base is None and depth == 0)
                         or (type(base) is bytes and len(base) == ID_BYTES and 0 < depth <= MAX_CHAIN_DEPTH))
                    and (pack_len is None or (offset >= len(MAGIC) and offset + length <= pack_len - TRAILER_BYTES))):
                return tuple.__new__(cls, item)   # the list holds the fields in order
        return cls._checked(item, what=what, pack_len=pack_len)

    @classmethod
    def _checked(cls, item: object, *, what: str, pack_len: int | None) -> "PackEntry":
        if not isinstance(item, list) or len(item) != 7:
            raise CorruptObjectError(f"{what}: an entry must be a 7-element array")
        chunk_id = check_raw_id(item[0])
        offset = msgpack_io.expect_int(item[1], f"{what} offset", 0, MAX_PACK_BYTES)
        length = msgpack_io.expect_int(item[2], f"{what} length", 12, MAX_CHUNK_BYTES * 2)
        encoding = msgpack_io.expect_int(item[3], f"{what} encoding", 0, 255)
        raw_len = msgpack_io.expect_int(item[4], f"{what} raw length", 0, MAX_CHUNK_BYTES)
        base = None if item[5] is None else check_raw_id(item[5])
        depth = msgpack_io.expect_int(item[6], f"{what} depth", 0, MAX_CHAIN_DEPTH)
        if (base is None) != (depth == 0):
            raise CorruptObjectError(f"{what}: depth {depth} disagrees with base {base!r}")
        if pack_len is not None and (offset < len(MAGIC) or offset + length > pack_len - TRAILER_BYTES):
            raise CorruptObjectError(f"{what}: object range {offset}+{length} lies outside the pack")
        return cls(chunk_id, offset, length, encoding, raw_len, base, depth)


class PackStream:
    """Lays out a pack as its parts are produced, handing each part to ``sink`` (which may write
    it to a file) so a pack never needs to sit in memory whole.  The pack id is the xxh3-128 of
    all its bytes, known after :meth:`finish`.  A part is hashed when it is added and may be
    written later (store/staged_write.py holds a small file's parts): it must not change after."""

    def __init__(self, sink: Callable[[bytes | memoryview], None]) -> None:
        self._sink = sink
        self._hash = xxhash.xxh3_128()
        self._size = 0
        self.entries: list[PackEntry] = []
        self._emit(MAGIC)

    def _emit(self, part: bytes | memoryview) -> None:
        self._hash.update(part)
        self._size += len(part)
        self._sink(part)

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, chunk_id: bytes, parts: "list[bytes | memoryview] | bytes", *, encoding: int, raw_len: int,
            base: bytes | None, depth: int) -> PackEntry:
        if isinstance(parts, (bytes, bytearray, memoryview)):
            parts = [parts]
        length = sum(len(p) for p in parts)
        entry = PackEntry(chunk_id, self._size, length, encoding, raw_len, base, depth)
        for part in parts:
            self._emit(part)
        self.entries.append(entry)
        return entry

    def finish(self) -> str:
        """Emit header and trailer; return the pack id (hex)."""
        header = msgpack_io.pack([e.to_list() for e in self.entries])
        self._emit(header)
        self._emit(_TRAILER.pack(len(header), xxhash.xxh64_intdigest(header), END_MAGIC))
        return self._hash.hexdigest()


class PackBuilder(PackStream):
    """A pack assembled in memory (gc, tests, vectors)."""

    def __init__(self) -> None:
        # the sink holds the list, not the builder: a sink that reached the builder (a lambda over
        # self) made a reference cycle, so a deltification step's pack bytes (tens of MB) stayed
        # resident after the step until Python's cyclic collector happened to run
        parts: list[bytes] = []
        self._parts = parts
        super().__init__(lambda part: parts.append(bytes(part)))

    def finish(self) -> bytes:  # type: ignore[override]  # the pack's bytes, where a stream returns its id
        super().finish()
        data = b"".join(self._parts)
        self._parts.clear()   # the pack is held once, as ``data``, not twice
        return data


def parse_trailer(trailer: bytes, pack_len: int, *, what: str) -> int:
    """Return the header length from a pack's last 20 bytes, checked against the pack's size."""
    if pack_len < MIN_PACK_BYTES or len(trailer) != TRAILER_BYTES:
        raise CorruptObjectError(f"{what}: {pack_len} bytes is too short for a pack")
    header_len, _checksum, end_magic = _TRAILER.unpack(trailer)
    if end_magic != END_MAGIC:
        if end_magic[:7] == END_MAGIC[:7]:
            raise FormatVersionError(f"{what}: pack version {end_magic[7]} is not supported")
        raise CorruptObjectError(f"{what}: bad pack trailer magic")
    if header_len > MAX_PACK_HEADER_BYTES:
        raise LimitExceededError(f"{what}: header of {header_len} bytes exceeds the limit")
    if header_len + TRAILER_BYTES + len(MAGIC) > pack_len:
        raise CorruptObjectError(f"{what}: header length {header_len} runs past the pack start")
    return header_len


def parse_header(header: bytes, trailer: bytes, pack_len: int, *, what: str) -> list[PackEntry]:
    """Parse a pack header (the bytes just before the trailer) into bounds-checked entries."""
    _len, checksum, _magic = _TRAILER.unpack(trailer)
    if xxhash.xxh64_intdigest(header) != checksum:
        raise CorruptObjectError(f"{what}: header checksum mismatch")
    items = msgpack_io.unpack(header, what=f"{what} header", max_bytes=MAX_PACK_HEADER_BYTES)
    if not isinstance(items, list):
        raise CorruptObjectError(f"{what}: header is not an array")
    entries = [PackEntry.from_list(item, what=f"{what} entry {i}", pack_len=pack_len) for i, item in enumerate(items)]
    end = pack_len - TRAILER_BYTES - len(header)
    prev_end = len(MAGIC)
    for e in sorted(entries, key=lambda e: e.offset):
        if e.offset < prev_end or e.offset + e.length > end:
            raise CorruptObjectError(f"{what}: object {e.chunk_id.hex()} overlaps another or the header")
        prev_end = e.offset + e.length
    return entries


def parse_pack(data: bytes, *, what: str = "pack") -> list[PackEntry]:
    """Parse a whole pack held in memory."""
    if len(data) < MIN_PACK_BYTES or data[:len(MAGIC)] != MAGIC:
        if len(data) >= len(MAGIC) and data[:7] == MAGIC[:7]:
            raise FormatVersionError(f"{what}: pack version {data[7]} is not supported")
        raise CorruptObjectError(f"{what}: missing pack magic")
    trailer = data[-TRAILER_BYTES:]
    header_len = parse_trailer(trailer, len(data), what=what)
    header = data[len(data) - TRAILER_BYTES - header_len:len(data) - TRAILER_BYTES]
    return parse_header(header, trailer, len(data), what=what)


assert ID_BYTES == 16
