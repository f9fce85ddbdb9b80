"""Every crasher the fuzzers found, kept as a test (input bytes as hex).  Each once escaped as an
untyped exception; now the decoder must refuse it with a DeltackptError subclass."""

from __future__ import annotations

import msgpack
import pytest

from deltackpt.codecs import registry
from deltackpt.errors import CorruptObjectError, DeltackptError
from deltackpt.format import manifest, objects

from ._fuzz_targets import target


def test_manifest_of_six_magic_bytes():
    """fuzz_manifest crasher: b"DCKMAN" (6 bytes) raised IndexError reading the version byte; now CorruptObjectError."""
    data = bytes.fromhex("44434b4d414e")
    with pytest.raises(CorruptObjectError, match="magic"):
        manifest.decode(data)
    target("manifest").TestOneInput(data)


OBJECTS_CRASH = ("0301062600040000000000000083a26474a7666c6f61743634a16e01a462617365c41053b3d41101000000000000"
                 "843e78814e1683ffa8354f9a19282549123e070001003b0545")


def test_quantized_delta_with_raw_length_not_a_multiple_of_the_dtype():
    """fuzz_objects crasher: a q-delta object declaring float64 with raw_len 4 made numpy raise ValueError
    (viewing 4 bytes as float64); now CorruptObjectError before any decoding."""
    data = bytes.fromhex(OBJECTS_CRASH)
    obj = objects.parse(data[1:])
    assert obj.params["dt"] == "float64" and obj.raw_len % 8
    for codec in registry.all_codecs():
        try:
            codec.decode(obj.params, obj.payload, obj.raw_len, bytes(obj.raw_len))
        except DeltackptError:
            pass
    with pytest.raises(CorruptObjectError, match="multiple"):
        registry.get(registry.Q8_DELTA).decode(obj.params, obj.payload, obj.raw_len, bytes(obj.raw_len))
    target("objects").TestOneInput(data)


def test_msgpack_timestamp_in_a_manifest_tree():
    """Found while crafting hostile manifests: ext type -1 (timestamp) bypassed the ext hook and came back
    as a msgpack.Timestamp; now CorruptObjectError."""
    body = {"parent": None, "time": 0.0, "tree": {"t": msgpack.Timestamp(1, 0)}, "tensors": [], "blobs": []}
    data = manifest.MAGIC + msgpack.packb(body, use_bin_type=True)
    with pytest.raises(CorruptObjectError, match="timestamp"):
        manifest.decode(data)
    body["meta"] = {"when": msgpack.Timestamp(1, 0)}
    body["tree"] = {}
    with pytest.raises(CorruptObjectError, match="timestamp"):
        manifest.decode(manifest.MAGIC + msgpack.packb(body, use_bin_type=True))


def test_object_version_zero_is_corruption_not_a_newer_format():
    """An object header with version byte 0 (never written) is CorruptObjectError, not FormatVersionError."""
    data = bytes([0, 0, 0, 0]) + (4).to_bytes(8, "little") + b"abcd"
    with pytest.raises(CorruptObjectError, match="does not exist"):
        objects.parse(data)
