"""Bounds checks of the pack and object parsers (and msgpack lengths): every malformed input gives
a typed error before any allocation sized by the input (spec/FORMAT.md, "Threat model")."""

from __future__ import annotations

import struct

import msgpack
import pytest
import xxhash

from deltackpt.errors import CorruptObjectError, FormatVersionError, LimitExceededError
from deltackpt.format import msgpack_io, objects, pack
from deltackpt.format.limits import MAX_CHUNK_BYTES, MAX_PACK_HEADER_BYTES

from ._parser_inputs import CID, _pack, _raw_object


def _with_header(data: bytes, entries: list) -> bytes:
    """Replace a pack's header by ``entries`` with a valid length and checksum."""
    header_len = struct.unpack_from("<I", data, len(data) - pack.TRAILER_BYTES)[0]
    objects_end = len(data) - pack.TRAILER_BYTES - header_len
    header = msgpack.packb(entries, use_bin_type=True)
    return data[:objects_end] + header + struct.pack("<IQ", len(header), xxhash.xxh64_intdigest(header)) + pack.END_MAGIC


# packs ---------------------------------------------------------------------------------------
def test_pack_round_trip_is_valid():
    """A well-formed pack parses (the baseline every malformed variant below breaks)."""
    assert [e.offset for e in pack.parse_pack(_pack())] == [8, 24]


def test_pack_bad_start_magic():
    """A pack not starting with DCKPACK is corrupt."""
    with pytest.raises(CorruptObjectError, match="magic"):
        pack.parse_pack(b"XXXXXXXX" + _pack()[8:])


def test_pack_bad_trailer_magic():
    """A pack whose last 8 bytes are not DCKPEND<v> is corrupt."""
    data = _pack()
    with pytest.raises(CorruptObjectError, match="trailer magic"):
        pack.parse_pack(data[:-8] + b"NOTAPACK")


def test_pack_future_version_in_trailer():
    """A trailer magic with a newer version byte is a FormatVersionError, not corruption."""
    data = _pack()
    with pytest.raises(FormatVersionError, match="pack version 2"):
        pack.parse_trailer(data[-20:-8] + b"DCKPEND\x02", len(data), what="p")


def test_pack_future_version_at_start():
    """A pack magic with a newer version byte is a FormatVersionError."""
    data = _pack()
    with pytest.raises(FormatVersionError):
        pack.parse_pack(b"DCKPACK\x02" + data[8:])


def test_pack_header_length_past_start():
    """A header length reaching before the magic is refused from the trailer alone."""
    data = _pack()
    trailer = struct.pack("<IQ", len(data), 0) + pack.END_MAGIC
    with pytest.raises(CorruptObjectError, match="past the pack start"):
        pack.parse_trailer(trailer, len(data), what="p")


def test_pack_header_length_over_limit():
    """A header length above MAX_PACK_HEADER_BYTES is a LimitExceededError (nothing is fetched)."""
    trailer = struct.pack("<IQ", MAX_PACK_HEADER_BYTES + 1, 0) + pack.END_MAGIC
    with pytest.raises(LimitExceededError):
        pack.parse_trailer(trailer, 1 << 40, what="p")


def test_pack_too_short():
    """Fewer bytes than magic + trailer is not a pack."""
    with pytest.raises(CorruptObjectError, match="too short"):
        pack.parse_trailer(b"\x00" * 20, 27, what="p")


def test_pack_header_checksum_mismatch():
    """A flipped header byte fails the header's xxh64."""
    data = bytearray(_pack())
    data[-pack.TRAILER_BYTES - 3] ^= 0x01
    with pytest.raises(CorruptObjectError, match="checksum"):
        pack.parse_pack(bytes(data))


def test_pack_overlapping_offsets():
    """Two entries whose byte ranges overlap are refused."""
    data = _pack()
    entries = [[b"\x00" * 16, 8, 16, 0, 4, None, 0], [b"\x01" * 16, 16, 16, 0, 4, None, 0]]
    with pytest.raises(CorruptObjectError, match="overlaps"):
        pack.parse_pack(_with_header(data, entries))


def test_pack_entry_into_header():
    """An entry whose range runs into the header is refused."""
    data = _pack()
    entries = [[b"\x00" * 16, 8, 16, 0, 4, None, 0], [b"\x01" * 16, 24, 40, 0, 4, None, 0]]
    with pytest.raises(CorruptObjectError):
        pack.parse_pack(_with_header(data, entries))


def test_pack_entry_malformed():
    """Entries must be 7-element arrays with a 16-byte id and depth 0 exactly when base is nil."""
    data = _pack()
    for bad in ([[b"\x00" * 16, 8, 16, 0, 4, None]], [[b"\x00" * 15, 8, 16, 0, 4, None, 0]],
                [[b"\x00" * 16, 8, 16, 0, 4, None, 1]], [[b"\x00" * 16, 8, 16, 0, 4, CID, 0]],
                [[b"\x00" * 16, 8, 16, 256, 4, None, 0]], [[b"\x00" * 16, 8, 16, 0, MAX_CHUNK_BYTES + 1, None, 0]],
                {"not": "an array"}):
        with pytest.raises(CorruptObjectError):
            pack.parse_pack(_with_header(data, bad))


# objects -------------------------------------------------------------------------------------
def test_object_shorter_than_header():
    """An object shorter than its 12-byte header is corrupt."""
    with pytest.raises(CorruptObjectError, match="shorter"):
        objects.parse(b"\x01\x00\x00")


def test_object_future_version():
    """An object header version other than 1 is a FormatVersionError."""
    with pytest.raises(FormatVersionError):
        objects.parse(b"\x02" + _raw_object()[1:])


def test_object_params_past_end():
    """PARAMS_LEN larger than the bytes that follow is refused."""
    with pytest.raises(CorruptObjectError, match="parameter length"):
        objects.parse(struct.pack("<BBHQ", 1, 2, 100, 4) + b"\x80")


def test_object_params_over_limit():
    """PARAMS_LEN above MAX_OBJECT_PARAMS_BYTES is refused even when the bytes exist."""
    with pytest.raises(CorruptObjectError):
        objects.parse(struct.pack("<BBHQ", 1, 2, 5000, 4) + b"\x00" * 5000)


def test_object_raw_len_over_limit():
    """A RAW_LEN above MAX_CHUNK_BYTES is a LimitExceededError before any decoding."""
    with pytest.raises(LimitExceededError):
        objects.parse(struct.pack("<BBHQ", 1, 0, 0, MAX_CHUNK_BYTES + 1))


def test_object_params_not_a_map():
    """Codec parameters must be a msgpack map."""
    with pytest.raises(CorruptObjectError, match="not a map"):
        objects.parse(struct.pack("<BBHQ", 1, 1, 1, 0) + b"\x90")


def test_msgpack_huge_declared_array_is_refused_without_allocating():
    """A 5-byte msgpack array header declaring 2^32-1 items is refused (lengths bounded by input size)."""
    with pytest.raises(CorruptObjectError):
        msgpack_io.unpack(b"\xdd\xff\xff\xff\xff", what="x", max_bytes=100)


def test_a_pack_builder_is_freed_as_soon_as_it_is_dropped():
    """A pack assembled in memory (deltification's and gc's rewrites: tens of MB) is freed when its
    builder is dropped, not whenever Python's cyclic collector next runs: the builder is in no
    reference cycle, and after ``finish`` it holds the pack's parts no more."""
    import gc
    import weakref

    from deltackpt.format.pack import PackBuilder
    gc.disable()
    try:
        builder = PackBuilder()
        builder.add(bytes(16), [b"x" * 1000], encoding=0, raw_len=1000, base=None, depth=0)
        data = builder.finish()
        assert builder._parts == [] and len(data) > 1000
        gone = weakref.ref(builder)
        del builder
        assert gone() is None
    finally:
        gc.enable()
