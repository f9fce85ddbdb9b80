"""Bounds checks of the format parsers: every malformed input gives a typed error before any
allocation sized by the input (spec/FORMAT.md, "Threat model")."""

from __future__ import annotations

import struct

import msgpack
import pytest
import xxhash

from deltackpt.errors import (CorruptObjectError, FormatVersionError, InvalidNameError, LimitExceededError,
                              UnknownVersionError)
from deltackpt.format import config as config_fmt
from deltackpt.format import index as index_fmt
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format import msgpack_io, objects, pack, refs
from deltackpt.format.ids import hex_id
from deltackpt.format.limits import MAX_CHUNK_BYTES, MAX_NAME_LENGTH, MAX_PACK_HEADER_BYTES
from deltackpt.format.manifest import Blob, ChunkRef, Manifest, TensorEntry, TensorRef

CID = bytes(range(16))
CID2 = bytes(range(1, 17))


def _raw_object(payload: bytes = b"abcd") -> bytes:
    return objects.EncodedObject(0, len(payload), {}, payload).to_bytes()


def _pack(n: int = 2) -> bytes:
    b = pack.PackBuilder()
    for i in range(n):
        b.add(bytes([i]) * 16, _raw_object(bytes([i]) * 4), encoding=0, raw_len=4, base=None, depth=0)
    return b.finish()


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


# manifests ------------------------------------------------------------------------------------
def _manifest(**changes) -> Manifest:
    fields = dict(parent=None, time=1.0, tree={"w": TensorRef(0)},
                  tensors=[TensorEntry("w", ["w"], "float32", [2], [1], 0, 0)],
                  blobs=[Blob(8, 4, 4, [ChunkRef(CID, 8)])])
    fields.update(changes)
    return Manifest(**fields)


def _body(body: dict) -> bytes:
    return manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True)


def test_manifest_valid_baseline():
    """A well-formed manifest decodes and its id is the xxh3-128 of its bytes."""
    data = _manifest().to_bytes()
    assert manifest_fmt.decode(data, version_id=hex_id(data)).tensors[0].name == "w"


def test_manifest_hash_mismatch():
    """A manifest whose bytes do not hash to the id it was read under is corrupt."""
    data = _manifest().to_bytes()
    with pytest.raises(CorruptObjectError, match="hash"):
        manifest_fmt.decode(data, version_id="0" * 32)


def test_manifest_bad_magic_and_future_version():
    """Missing magic is corruption; a newer manifest version byte is a FormatVersionError."""
    data = _manifest().to_bytes()
    with pytest.raises(CorruptObjectError):
        manifest_fmt.decode(b"XXXXXXXX" + data[8:])
    with pytest.raises(FormatVersionError):
        manifest_fmt.decode(b"DCKMAN\x02\x00" + data[8:])


def test_manifest_missing_keys():
    """Each required top-level key (parent, time, tree, tensors, blobs) must be present."""
    for key in ("parent", "time", "tree", "tensors", "blobs"):
        body = {"parent": None, "time": 1.0, "tree": None, "tensors": [], "blobs": []}
        del body[key]
        with pytest.raises(CorruptObjectError, match=key):
            manifest_fmt.decode(_body(body))


def test_manifest_tensor_missing_keys():
    """A tensor entry lacking a required key is corrupt."""
    body = {"parent": None, "time": 1.0, "tree": None, "blobs": [], "tensors": [{"name": "w"}]}
    with pytest.raises(CorruptObjectError, match="lacks"):
        manifest_fmt.decode(_body(body))


def test_manifest_view_outside_blob():
    """A tensor view (offset + strided span) past its blob's end is refused."""
    for entry in (TensorEntry("w", ["w"], "float32", [3], [1], 0, 0),
                  TensorEntry("w", ["w"], "float32", [2], [1], 0, 4),
                  TensorEntry("w", ["w"], "float32", [2], [2], 0, 0),
                  TensorEntry("w", ["w"], "float32", [1], [1], 0, 2)):  # misaligned offset
        with pytest.raises(CorruptObjectError, match="outside"):
            manifest_fmt.decode(_manifest(tensors=[entry]).to_bytes())


def test_manifest_terabyte_shape_is_refused_without_allocating():
    """A 1 TiB float32 shape over an 8-byte blob is refused by arithmetic alone."""
    entry = TensorEntry("w", ["w"], "float32", [1 << 38], [1], 0, 0)
    with pytest.raises(CorruptObjectError, match="outside"):
        manifest_fmt.decode(_manifest(tensors=[entry]).to_bytes())


def test_manifest_element_count_over_limit():
    """A shape whose product exceeds MAX_TENSOR_ELEMENTS is a LimitExceededError."""
    entry = TensorEntry("w", ["w"], "float32", [1 << 25, 1 << 25], [1 << 25, 1], 0, 0)
    with pytest.raises(LimitExceededError):
        manifest_fmt.decode(_manifest(tensors=[entry]).to_bytes())


def test_manifest_unknown_dtype_and_bad_blob_index():
    """An unknown dtype name and a blob index past the blob list are corrupt."""
    for entry in (TensorEntry("w", ["w"], "float128", [2], [1], 0, 0),
                  TensorEntry("w", ["w"], "float32", [2], [1], 5, 0)):
        with pytest.raises(CorruptObjectError):
            manifest_fmt.decode(_manifest(tensors=[entry]).to_bytes())


def test_manifest_chunk_lengths_must_sum_to_blob():
    """A blob whose chunk lengths do not add up to nbytes is corrupt."""
    with pytest.raises(CorruptObjectError, match="sum"):
        manifest_fmt.decode(_manifest(blobs=[Blob(8, 4, 4, [ChunkRef(CID, 4)])]).to_bytes())


def test_manifest_unknown_ext_type():
    """A msgpack ext type other than 1 (tensor) and 2 (tuple) in the tree is refused."""
    data = manifest_fmt.MAGIC + msgpack.packb({"parent": None, "time": 1.0, "tensors": [], "blobs": [],
                                               "tree": msgpack.ExtType(7, b"\x00")}, use_bin_type=True)
    with pytest.raises(CorruptObjectError, match="ext type 7"):
        manifest_fmt.decode(data)


def test_manifest_tree_refers_to_missing_tensor():
    """A tensor reference (ext 1) past the tensors list is refused."""
    data = _manifest(tree={"w": TensorRef(0), "x": TensorRef(3)}).to_bytes()
    with pytest.raises(CorruptObjectError, match="refers to tensor 3"):
        manifest_fmt.decode(data)


def test_manifest_tree_too_deep():
    """A tree nested deeper than MAX_MSGPACK_DEPTH is a LimitExceededError."""
    tree: object = 0
    for _ in range(600):
        tree = [tree]
    data = manifest_fmt.MAGIC + msgpack.packb({"parent": None, "time": 1.0, "tensors": [], "blobs": [],
                                               "tree": tree}, use_bin_type=True)
    with pytest.raises(LimitExceededError, match="deeper"):
        manifest_fmt.decode(data)


def test_manifest_bad_parent():
    """A parent that is not a 32-hex version id is corrupt."""
    with pytest.raises(CorruptObjectError):
        manifest_fmt.decode(_manifest(parent="../../etc").to_bytes())


# index ----------------------------------------------------------------------------------------
def _index() -> bytes:
    data = _pack()
    return index_fmt.encode({hex_id(data): (len(data), pack.parse_pack(data))})


def test_index_baseline_and_checksum():
    """A valid index decodes; one flipped body byte fails its xxh64."""
    data = _index()
    assert len(next(iter(index_fmt.decode(data).values()))[1]) == 2
    bad = bytearray(data)
    bad[10] ^= 1
    with pytest.raises(CorruptObjectError, match="checksum"):
        index_fmt.decode(bytes(bad))


def test_index_magic_and_future_version():
    """Bad index magic is corruption; a newer index version byte is a FormatVersionError."""
    data = _index()
    with pytest.raises(CorruptObjectError):
        index_fmt.decode(b"XXXXXXXX" + data[8:])
    with pytest.raises(FormatVersionError):
        index_fmt.decode(b"DCKIDX\x02\x00" + data[8:])


def _index_body(body: object) -> bytes:
    raw = msgpack.packb(body, use_bin_type=True)
    return index_fmt.MAGIC + raw + struct.pack("<Q", xxhash.xxh64_intdigest(raw))


def test_index_malformed_bodies():
    """Non-hex pack ids, malformed values and entries outside their pack are corrupt."""
    entry = [CID, 8, 16, 0, 4, None, 0]
    for body in ([], {"../x": [100, [entry]]}, {"ab" * 16: [100]}, {"ab" * 16: [20, [entry]]},
                 {"ab" * 16: [-1, [entry]]}):
        with pytest.raises(CorruptObjectError):
            index_fmt.decode(_index_body(body))


# refs, revisions, config ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../x", "a/b", "", "x" * (MAX_NAME_LENGTH + 1), ".hidden", "-opt", "a..b",
                                  "latest", "HEAD", "best", "best-run", "x.tmp", "x.lock", "a b", "a\\b", "é"])
def test_check_name_refuses(name):
    """Tag names that could escape refs/tags/, collide with reserved words or temp files are refused."""
    with pytest.raises(InvalidNameError):
        refs.check_name(name)


def test_check_name_accepts():
    """Ordinary names (letters, digits, '.', '_', '-') up to the length limit are accepted."""
    for name in ("v1", "epoch_3.final", "run-2", "x" * MAX_NAME_LENGTH):
        assert refs.check_name(name) == name


def test_decode_ref_refuses():
    """Ref contents other than one 32-hex id (and whitespace) are corrupt."""
    for data in (b"", b"abc\n", b"\xff" * 33, b"A" * 32, b"0" * 5000, b"0" * 31 + b"g"):
        with pytest.raises(CorruptObjectError):
            refs.decode_ref(data, what="refs/latest")


def test_ref_whitespace_is_the_six_ascii_characters():
    """Around a ref's id only space, tab, LF, CR, VT and FF are stripped (what every language calls
    whitespace); Python's str.strip also took the separators 0x1c-0x1f, which C readers refuse."""
    vid = "ab" * 16
    assert refs.decode_ref((" \t\r\x0b\x0c" + vid + "\n").encode(), what="refs/latest") == vid
    for sep in (b"\x1c", b"\x1f", b"\x85"):
        with pytest.raises(CorruptObjectError):
            refs.decode_ref(sep + vid.encode() + b"\n", what="refs/latest")


def test_parse_revision():
    """Revisions are BASE or BASE~N (N up to 6 digits); a bare '~' or empty text is an unknown version."""
    assert refs.parse_revision("latest~3") == refs.Revision("latest", 3)
    assert refs.parse_revision("best:loss:max") == refs.Revision("best:loss:max", 0)
    for bad in ("", "latest~", "~2", "a~1~2", "x" * 300, "latest~1234567", " " * 10):
        with pytest.raises(UnknownVersionError):
            refs.parse_revision(bad)
    assert refs.parse_revision(" " * 300 + "v1~2\n") == refs.Revision("v1", 2)  # bounded after stripping


def test_parse_best_takes_only_a_final_min_or_max_as_the_direction():
    """best:METRIC[:min|:max]: the metric is everything between, colons included; empty is refused."""
    assert refs.parse_best("best:loss") == ("loss", "min")
    assert refs.parse_best("best:acc:max") == ("acc", "max")
    assert refs.parse_best("best:val:acc:max") == ("val:acc", "max")
    assert refs.parse_best("best:a:b") == ("a:b", "min")
    assert refs.parse_best("best:x:max:min") == ("x:max", "min")
    for bad in ("best:", "best::min", "best::max"):
        with pytest.raises(UnknownVersionError):
            refs.parse_best(bad)


def test_config_future_version():
    """A config with a format version this reader does not know is a FormatVersionError."""
    data = msgpack.packb({"format": "deltackpt", "version": 3, "repo_id": "ab"})
    with pytest.raises(FormatVersionError, match="version 3"):
        config_fmt.decode(data, where="repo")


def test_config_not_a_config():
    """A config of another format, without repo_id, or with a chunk size over the limit is corrupt."""
    for body in ({"format": "restic", "version": 1, "repo_id": "ab"}, {"format": "deltackpt", "version": 1},
                 {"format": "deltackpt", "version": 1, "repo_id": "ab", "chunk_bytes": MAX_CHUNK_BYTES + 1}, [1]):
        with pytest.raises(CorruptObjectError):
            config_fmt.decode(msgpack.packb(body), where="repo")


def test_config_delta_base_defaults_per_format_version_and_is_checked():
    """Format 2 writes delta_base ("child" by default); a format-1 config without it means "parent"
    (and "parent" is not written there, so older configs' bytes are unchanged); "keyframe"
    round-trips; "child" in a format-1 config, or any other value, is refused as corrupt."""
    cfg = config_fmt.Config(repo_id="ab" * 16, created=1.0)
    assert cfg.version == 2 and config_fmt.decode(cfg.to_bytes(), where="t").delta_base == "child"
    assert msgpack.unpackb(cfg.to_bytes())["delta_base"] == "child"
    v1 = config_fmt.Config(repo_id="ab" * 16, created=1.0, version=1, delta_base="parent")
    assert b"delta_base" not in v1.to_bytes()
    assert config_fmt.decode(v1.to_bytes(), where="t").delta_base == "parent"
    v1.delta_base = "keyframe"
    assert config_fmt.decode(v1.to_bytes(), where="t").delta_base == "keyframe"
    obj = msgpack.unpackb(v1.to_bytes())
    for bad in ("sideways", "child"):
        obj["delta_base"] = bad
        with pytest.raises(CorruptObjectError):
            config_fmt.decode(msgpack.packb(obj), where="t")
