"""Each "a decoder MUST check" of spec/codecs/*.md, exercised on the golden vectors: a mutated
parameter or payload gives CorruptObjectError before anything sized by it is allocated."""

from __future__ import annotations

import json
import os

import pytest
import zstandard

from deltackpt.codecs import registry
from deltackpt.errors import CorruptObjectError
from deltackpt.format import objects

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "spec", "vectors")


def case(name: str, i: int = 0) -> tuple:
    with open(os.path.join(VECTORS, f"codec-{name}.json")) as f:
        c = json.load(f)["cases"][i]
    obj = objects.parse(bytes.fromhex(c["object"]))
    base = None if c["base"] is None else bytes.fromhex(c["base"])
    return registry.get(obj.encoding), dict(obj.params), bytes(obj.payload), obj.raw_len, base


def refused(codec, params, payload, raw_len, base, match=None):
    with pytest.raises(CorruptObjectError, match=match):
        codec.decode(params, payload, raw_len, base)


def test_raw_length_must_match():
    """raw: a payload of another length than RAW_LEN is refused."""
    codec, params, payload, n, base = case("raw")
    refused(codec, params, payload[:-1], n, base)


@pytest.mark.parametrize("change", [{"w": 0}, {"w": 17}, {"w": "4"}, {"m": [0, 0, 0]}, {"s": [64, 64, 64]},
                                    {"m": [0, 0, 0, 2]}, {"s": [64, 64, 64, 18]}, {"s": [63, 64, 64, 17]},
                                    {"s": [64, 64, 64, -1]}])
def test_plane_layout_parameters(change):
    """bg-zstd plane layout: w in 1..16, len(m) = len(s) = w, modes 0/1, sizes within the payload."""
    codec, params, payload, n, base = case("bg-zstd")
    refused(codec, params | change, payload, n, base)


def test_plane_layout_trailing_bytes_and_width_divides():
    """Bytes after the last plane are refused, and RAW_LEN must be a multiple of w."""
    codec, params, payload, n, base = case("bg-zstd")
    refused(codec, params, payload + b"\x00", n, base, match="trailing")
    refused(codec, params, payload, n - 1, base)


def test_zstd_frame_must_declare_its_exact_size():
    """A compressed plane whose frame declares another size, or none, is refused before decompressing."""
    codec, params, payload, n, base = case("bg-zstd")
    w, sizes = params["w"], params["s"]
    start = sum(sizes[:3])
    for frame in (zstandard.ZstdCompressor().compress(b"\x00" * (n // w + 1)),
                  zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00" * (n // w))):
        refused(codec, params | {"s": sizes[:3] + [len(frame)]}, payload[:start] + frame, n, base)


@pytest.mark.parametrize("name", ["xor-delta", "sub-delta", "sparse", "q8-delta", "q4-delta", "q8-scaled-delta",
                                  "q4-scaled-delta"])
def test_delta_needs_a_base_of_the_right_length(name):
    """Every delta codec refuses a missing base or one whose length is not RAW_LEN."""
    codec, params, payload, n, base = case(name)
    refused(codec, params, payload, n, None)
    refused(codec, params, payload, n, base[:-2])


def test_sub_delta_width_must_be_an_integer_size():
    """sub-delta refuses a plane width that is not 1, 2, 4 or 8."""
    codec, params, payload, n, base = case("sub-delta", 1)
    refused(codec, params | {"w": 16, "m": [0] * 16, "s": [n // 16] * 16}, payload[:n], n, base)


@pytest.mark.parametrize("change", [{"rb": 0}, {"rb": 7}, {"n": 9}, {"n": 2}, {"bm": 10_000}, {"bm": -1}, {"n": "1"}])
def test_sparse_parameters(change):
    """sparse: rb divides RAW_LEN, 0 <= n <= rows and equals the bitmap's count, bm within the payload."""
    codec, params, payload, n, base = case("sparse")
    refused(codec, params | change, payload, n, base)


@pytest.mark.parametrize("name", ["q8-delta", "q4-delta", "q8-scaled-delta", "q4-scaled-delta"])
@pytest.mark.parametrize("change", [{"dt": "int8"}, {"n": 299}, {"n": -1}, {"n": 1 << 40}])
def test_quantized_parameters(name, change):
    """q8/q4-delta and their scaled variants: dt is a float type and n matches the base's element count."""
    codec, params, payload, n, base = case(name)
    refused(codec, params | change, payload, n, base)


@pytest.mark.parametrize("name", ["q8-scaled-delta", "q4-scaled-delta"])
@pytest.mark.parametrize("alpha", [None, float("nan"), float("inf"), "0.9", 1])
def test_scaled_quantized_alpha(name, alpha):
    """q8/q4-scaled-delta: a is present, a float and finite."""
    codec, params, payload, n, base = case(name)
    params = {k: v for k, v in params.items() if k != "a"} | ({} if alpha is None else {"a": alpha})
    refused(codec, params, payload, n, base)


@pytest.mark.parametrize("name", ["q8-scaled-delta", "q4-scaled-delta"])
def test_scaled_quantized_frame_size(name):
    """q8/q4-scaled-delta: the frame must declare exactly the content size of n elements."""
    codec, params, payload, n, base = case(name)
    body = zstandard.ZstdDecompressor().decompress(payload)
    for bad in (body[:-1], body + b"\0", body[:4]):
        refused(codec, params, zstandard.ZstdCompressor().compress(bad), n, base)
    refused(codec, params, zstandard.ZstdCompressor(write_content_size=False).compress(body), n, base)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_cast_parameters(name):
    """fp16/bf16: the source dtype is float32 or float64 and RAW_LEN is a multiple of its size."""
    codec, params, payload, n, base = case(name)
    refused(codec, params | {"dt": "float16"}, payload, n, base)
    refused(codec, params, payload, n - 2, base)


def test_a_keyframe_object_carrying_a_base_parameter_is_refused():
    """The base check of FORMAT.md §6 holds for keyframes too: a raw object whose parameters name a
    16-byte base disagrees with its entry's nil base (raw.md's "ignore any parameters" excepts it)."""
    from deltackpt.format.pack import PackEntry
    from deltackpt.repo.read.reader import ChunkReader
    raw = bytes(8)
    cid = bytes(range(16))
    plain = objects.EncodedObject(0, 8, {}, raw).to_bytes()
    entry = PackEntry(cid, 8, len(plain), 0, 8, None, 0)
    assert bytes(ChunkReader._check_object("p", entry, plain).payload) == raw
    for params, ok in (({"x": 1}, True), ({"base": 5}, True), ({"base": cid}, False)):
        obj = objects.EncodedObject(0, 8, params, raw).to_bytes()
        entry = PackEntry(cid, 8, len(obj), 0, 8, None, 0)
        if ok:
            ChunkReader._check_object("p", entry, obj)
        else:
            with pytest.raises(CorruptObjectError, match="base disagrees"):
                ChunkReader._check_object("p", entry, obj)
