"""Content identifiers: xxh3-128 digests, written as 32 lowercase hex characters."""

from __future__ import annotations

import re

import xxhash

from ..errors import CorruptObjectError

ID_BYTES = 16
ID_HEX_LEN = 32
_HEX = re.compile(r"[0-9a-f]{1,32}")  # always fullmatch: '$' would also match before a final newline


def digest(data: bytes | bytearray | memoryview) -> bytes:
    """xxh3-128 of ``data`` as 16 big-endian bytes (the canonical hex order)."""
    return xxhash.xxh3_128_digest(data)


def hex_id(data: bytes | bytearray | memoryview) -> str:
    """xxh3-128 of ``data`` as 32 hex characters."""
    return xxhash.xxh3_128_hexdigest(data)


def to_hex(raw_id: bytes) -> str:
    """16-byte id -> hex."""
    check_raw_id(raw_id)
    return raw_id.hex()


def from_hex(text: str) -> bytes:
    """32 hex characters -> 16-byte id; raises CorruptObjectError on anything else."""
    if not isinstance(text, str) or len(text) != ID_HEX_LEN or not _HEX.fullmatch(text):
        raise CorruptObjectError(f"not a 32-character hex id: {text!r}")
    return bytes.fromhex(text)


def is_hex_prefix(text: str) -> bool:
    """True for 1..32 lowercase hex characters (a version id or its prefix)."""
    return bool(_HEX.fullmatch(text))


def check_raw_id(raw_id: object) -> bytes:
    """Validate a 16-byte id read from storage."""
    if not isinstance(raw_id, (bytes, bytearray)) or len(raw_id) != ID_BYTES:
        raise CorruptObjectError(f"object id must be {ID_BYTES} bytes, got {raw_id!r:.60}")
    return bytes(raw_id)
