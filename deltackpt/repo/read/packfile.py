"""A pack file read from a store in bounded pieces, never whole: packs reach MAX_PACK_BYTES (1 TiB),
and a stranger's sparse file costs nothing on disk but its full size in memory if read at once.

:func:`read_entries` takes the trailer and header (two ranged reads; what rebuild_index needs);
:func:`check` adds a streamed re-hash of every byte against the pack's name (what verify needs).
"""

from __future__ import annotations

import xxhash

from ...errors import CorruptObjectError, FormatVersionError, LimitExceededError
from ...format import pack as pack_fmt
from ...format.limits import MAX_PACK_BYTES
from ...format.pack import PackEntry
from ...store.base import Store
from ..layout import pack_key

HASH_PIECE_BYTES = 8 << 20
"""A streamed re-hash reads this much at a time: memory stays flat whatever the pack's size."""


def read_entries(store: Store, pid: str) -> tuple[int, list[PackEntry]]:
    """(size, entries) of pack ``pid`` from its trailer and header, checked against its size."""
    key, what = pack_key(pid), f"pack {pid}"
    size = store.size(key)
    if size > MAX_PACK_BYTES:
        raise LimitExceededError(f"{what}: {size} bytes exceeds the limit of {MAX_PACK_BYTES}")
    if size < pack_fmt.MIN_PACK_BYTES:
        raise CorruptObjectError(f"{what}: {size} bytes is too short for a pack")
    trailer = store.get(key, size - pack_fmt.TRAILER_BYTES, pack_fmt.TRAILER_BYTES)
    header_len = pack_fmt.parse_trailer(trailer, size, what=what)
    header = store.get(key, size - pack_fmt.TRAILER_BYTES - header_len, header_len)
    return size, pack_fmt.parse_header(header, trailer, size, what=what)


def check(store: Store, pid: str) -> list[PackEntry]:
    """Parse pack ``pid``'s header, then re-hash all its bytes against its name, a piece at a time.
    The cheap structural checks come first, so a file of zeros is refused without reading it."""
    key, what = pack_key(pid), f"pack {pid}"
    size, entries = read_entries(store, pid)
    digest = xxhash.xxh3_128()
    pos = 0
    while pos < size:
        piece = store.get(key, pos, min(HASH_PIECE_BYTES, size - pos))
        if not piece:
            raise CorruptObjectError(f"{what}: shrank to {pos} bytes while being read (was {size})")
        if pos == 0 and piece[:len(pack_fmt.MAGIC)] != pack_fmt.MAGIC:
            if piece[:7] == pack_fmt.MAGIC[:7]:
                raise FormatVersionError(f"{what}: pack version {piece[7]} is not supported")
            raise CorruptObjectError(f"{what}: missing pack magic")
        digest.update(piece)
        pos += len(piece)
    if digest.hexdigest() != pid:
        raise CorruptObjectError(f"{what}: pack bytes do not hash to the pack's name")
    return entries
