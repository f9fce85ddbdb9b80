"""Index files: chunk id -> (pack, offset, length, encoding, raw length, base, depth).

Version 1 (formats 1 and 2)::

    index = MAGIC(8) || BODY || XXH64(BODY)(u64 LE)
    BODY  = msgpack map { pack_id_hex: [pack_len, [entry, ...]] }   (entries as in the pack header)

Version 2 (format 3): fixed-width columns sorted by chunk id, searched in place (index_table.py).
A writer writes the version its repository's format calls for (:func:`version_for`).

A save writes one index file for the packs it wrote; gc writes one consolidated file.  The union
of all index files is the repository's index.  Everything in it can be rebuilt from the packs.

Example::

    data = encode({pack_id: (pack_len, entries)}, version=version_for(config.version))
    decode(data)      # {pack_id: (pack_len, entries)}, whichever version
"""

from __future__ import annotations

import struct

import xxhash

from ..errors import CorruptObjectError, FormatVersionError
from . import msgpack_io
from .ids import from_hex
from .limits import MAX_INDEX_BYTES, MAX_PACK_BYTES
from .index_table import MAGIC as MAGIC_V2, IndexTable, encode as _encode_v2
from .pack import PackEntry

MAGIC = b"DCKIDX\x01\x00"
_SUM = struct.Struct("<Q")


def version_for(format_version: int) -> int:
    """The index version a repository of ``format_version`` is written with."""
    return 2 if format_version >= 3 else 1


def encode(packs: dict[str, tuple[int, list[PackEntry]]], version: int = 1) -> bytes:
    """An index file naming ``packs`` ({pack id: (pack length, entries)}) in index ``version``."""
    if version == 2:
        return _encode_v2(packs)
    body = msgpack_io.pack({pid: [plen, [e.to_list() for e in entries]] for pid, (plen, entries) in packs.items()})
    return MAGIC + body + _SUM.pack(xxhash.xxh64_intdigest(body))


def decode_any(data: bytes, *, what: str = "index") -> dict[str, tuple[int, list[PackEntry]]] | IndexTable:
    """A version-2 file as an :class:`IndexTable` (checked whole, entries built when looked up), a
    version-1 file decoded as :func:`decode` does."""
    if data[:8] == MAGIC_V2:
        return IndexTable.decode(data, what=what)
    return decode(data, what=what)


def decode(data: bytes, *, what: str = "index") -> dict[str, tuple[int, list[PackEntry]]]:
    """An index file of either version as {pack id: (pack length, entries)}."""
    if len(data) < len(MAGIC) + _SUM.size or data[:6] != MAGIC[:6]:
        raise CorruptObjectError(f"{what}: missing index magic")
    if data[:8] == MAGIC_V2:
        return IndexTable.decode(data, what=what).packs()
    if data[:8] != MAGIC:
        raise FormatVersionError(f"{what}: index version {data[6]} (reserved byte {data[7]}) is not supported; "
                                 f"this deltackpt reads index versions 1 and 2: written by a newer deltackpt?")
    body = data[len(MAGIC):-_SUM.size]
    (checksum,) = _SUM.unpack(data[-_SUM.size:])
    if xxhash.xxh64_intdigest(body) != checksum:
        raise CorruptObjectError(f"{what}: checksum mismatch")
    raw = msgpack_io.unpack(body, what=what, max_bytes=MAX_INDEX_BYTES)
    if not isinstance(raw, dict):
        raise CorruptObjectError(f"{what}: body is not a map")
    out: dict[str, tuple[int, list[PackEntry]]] = {}
    for pid, value in raw.items():
        if not isinstance(pid, str):
            raise CorruptObjectError(f"{what}: pack id {pid!r:.40} is not a string")
        from_hex(pid)
        if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], list):
            raise CorruptObjectError(f"{what}: pack {pid} entry is malformed")
        plen = msgpack_io.expect_int(value[0], f"{what} pack {pid} length", 0, MAX_PACK_BYTES)
        out[pid] = (plen, [PackEntry.from_list(item, what=f"{what} pack {pid}", pack_len=plen) for item in value[1]])
    return out
