"""Bounds checks of the format parsers: every malformed input gives a typed error before any
allocation sized by the input (spec/FORMAT.md, "Threat model").  This module: index files, refs,
revisions and config; packs and objects in test_pack_parsers.py, manifests in
test_manifest_parsers.py."""

from __future__ import annotations

import struct

import msgpack
import pytest
import xxhash

from deltackpt.errors import CorruptObjectError, FormatVersionError, InvalidNameError, UnknownVersionError
from deltackpt.format import config as config_fmt
from deltackpt.format import index as index_fmt
from deltackpt.format import pack, refs
from deltackpt.format.ids import hex_id
from deltackpt.format.limits import MAX_CHUNK_BYTES, MAX_NAME_LENGTH

from ._parser_inputs import CID, _pack


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
    for future in (b"DCKIDX\x03\x00", b"DCKIDX\x01\x01", b"DCKIDX\x02\x01"):
        with pytest.raises(FormatVersionError):
            index_fmt.decode(future + data[8:])
        with pytest.raises(FormatVersionError):
            index_fmt.decode_any(future + data[8:])


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
    data = msgpack.packb({"format": "deltackpt", "version": 4, "repo_id": "ab"})
    with pytest.raises(FormatVersionError, match="version 4"):
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
    assert cfg.version == 3 and config_fmt.decode(cfg.to_bytes(), where="t").delta_base == "child"
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
