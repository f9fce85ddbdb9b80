"""Golden vectors (spec/vectors/*.json) pin the on-disk bytes of format version 1.

Each vector is decoded with the current code and must give the recorded bytes; deterministic
writers (objects, packs, index, manifests, config, refs) must reproduce the recorded bytes exactly.
Regenerating the vectors is a format change: see spec/FORMAT.md, "Changes".
"""

from __future__ import annotations

import glob
import json
import os

import pytest
import zstandard

from deltackpt.codecs import registry
from deltackpt.codecs.base import ChunkContext
from deltackpt.format import config as config_fmt
from deltackpt.format import index as index_fmt
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format import objects, refs
from deltackpt.format.ids import digest, hex_id
from deltackpt.format.pack import PackBuilder, parse_pack

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "spec", "vectors")
ZSTD_NOW = ".".join(map(str, zstandard.ZSTD_VERSION))


def load(name: str) -> dict:
    with open(os.path.join(VECTORS, f"{name}.json")) as f:
        return json.load(f)


def codec_cases() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(glob.glob(os.path.join(VECTORS, "codec-*.json"))):
        with open(path) as f:
            vec = json.load(f)
        for i, case in enumerate(vec["cases"]):
            out.append((f"{case['codec']}-{i}", case | {"_zstd": vec["generator"]["zstd"]}))
    return out


def _hex(value: str | None) -> bytes | None:
    return None if value is None else bytes.fromhex(value)


def test_every_registered_codec_has_a_vector():
    """Each frozen encoding id has a golden vector, so no codec's bytes go unpinned."""
    covered = {case["encoding"] for _, case in codec_cases()}
    assert covered == {c.encoding_id for c in registry.all_codecs()}


@pytest.mark.parametrize("case", [c for _, c in codec_cases()], ids=[n for n, _ in codec_cases()])
def test_codec_vector_decodes(case):
    """A recorded object decodes (header, params, payload, codec) to exactly the recorded bytes."""
    obj = objects.parse(bytes.fromhex(case["object"]))
    assert obj.encoding == case["encoding"] and obj.raw_len == len(case["decoded"]) // 2
    base = _hex(case["base"])
    if case["base_id"] is not None:
        assert obj.params["base"] == bytes.fromhex(case["base_id"]) == digest(base)
    out = bytes(registry.get(obj.encoding).decode(obj.params, bytes(obj.payload), obj.raw_len, base))
    assert out.hex() == case["decoded"]
    assert digest(out).hex() == case["chunk_id"]
    if case["lossless"]:
        assert case["decoded"] == case["input"]


@pytest.mark.parametrize("case", [c for _, c in codec_cases()], ids=[n for n, _ in codec_cases()])
def test_codec_vector_reencodes(case):
    """Encoding the recorded input (and base) reproduces the recorded object bytes exactly."""
    codec = registry.get(case["encoding"])
    ctx = ChunkContext(case["dtype"], case["itemsize"], case["row_bytes"], case["zstd_level"])
    base = _hex(case["base"])
    enc = codec.encode(bytes.fromhex(case["input"]), ctx, base)
    params = dict(enc.params)
    if codec.needs_base:
        params["base"] = digest(base)
    obj = objects.EncodedObject(codec.encoding_id, len(case["input"]) // 2, params, bytes(enc.payload)).to_bytes()
    assert obj.hex() == case["object"], (
        f"{case['codec']}: encoder output changed (vectors made with zstd {case['_zstd']}, now {ZSTD_NOW}); "
        "if only the zstd library changed and decoding still passes, regenerate and note it in the spec")


def test_pack_vector_parses_and_rebuilds():
    """The recorded pack parses to the recorded entries and is rebuilt byte for byte from its objects."""
    vec = load("pack")
    data = bytes.fromhex(vec["pack"])
    assert hex_id(data) == vec["pack_id"]
    entries = parse_pack(data)
    got = [[e.chunk_id.hex(), e.offset, e.length, e.encoding, e.raw_len, None if e.base is None else e.base.hex(),
            e.depth] for e in entries]
    assert got == vec["entries"]
    builder = PackBuilder()
    for e in entries:
        builder.add(e.chunk_id, data[e.offset:e.offset + e.length], encoding=e.encoding, raw_len=e.raw_len,
                    base=e.base, depth=e.depth)
    assert bytes(builder.finish()).hex() == vec["pack"]


@pytest.mark.parametrize("name, version", [("index", 1), ("index-v2", 2)])
def test_index_vector_decodes_and_reencodes(name, version):
    """The recorded index files (version 1 and version 2) decode to the pack's entries and
    re-encode to the same bytes and key; a version-2 file finds each entry by its chunk id."""
    vec = load(name)
    data = bytes.fromhex(vec["index"])
    assert data[6] == version
    decoded = index_fmt.decode(data)
    assert list(decoded) == [vec["pack_id"]]
    plen, entries = decoded[vec["pack_id"]]
    assert plen == vec["pack_len"]
    rows = [[e.chunk_id.hex(), e.offset, e.length, e.encoding, e.raw_len, None if e.base is None else e.base.hex(),
             e.depth] for e in entries]
    assert rows == vec["entries"]
    assert index_fmt.encode(decoded, version) == data
    assert "index/" + hex_id(data) == vec["key"]
    if version == 2:
        table = index_fmt.decode_any(data)
        for e in entries:
            found = {e.chunk_id: []}
            table.lookup([e.chunk_id], found)
            assert found[e.chunk_id] == [(vec["pack_id"], e)]


def _jsonish(value):
    if isinstance(value, (bytes, bytearray)):
        return {"bin": bytes(value).hex()}
    if isinstance(value, manifest_fmt.TensorRef):
        return {"tensor": value.index}
    if isinstance(value, tuple):
        return {"tuple": [_jsonish(v) for v in value]}
    if isinstance(value, list):
        return [_jsonish(v) for v in value]
    if isinstance(value, dict):
        return {"map": [[_jsonish(k), _jsonish(v)] for k, v in value.items()]}
    if isinstance(value, float) and value != value:
        return {"float": "nan"}
    return value


def test_manifest_vector_decodes_and_reencodes():
    """The recorded manifest passes the schema, decodes to the recorded values, hashes to its id and
    re-encodes byte for byte (tensor refs as ext 1, tuples as ext 2, int map keys, NaN, bytes)."""
    vec = load("manifest")
    data = bytes.fromhex(vec["manifest"])
    m = manifest_fmt.decode(data, version_id=vec["version_id"])
    want = vec["decoded"]
    assert (m.parent, m.time, m.step, m.writer) == (want["parent"], want["time"], want["step"], want["writer"])
    assert _jsonish(m.metrics) == want["metrics"] and _jsonish(m.meta) == want["meta"]
    assert _jsonish(m.extra) == want["extra"]
    assert [_jsonish(b.to_obj()) for b in m.blobs] == want["blobs"]
    assert [_jsonish(t.to_obj()) for t in m.tensors] == want["tensors"]
    assert _jsonish(m.tree) == want["tree"]
    assert m.to_bytes() == data


@pytest.mark.parametrize("name, version, delta_base", [("config-v3", 3, "child"), ("config", 2, "child"),
                                                       ("config-v1", 1, "parent")])
def test_config_vector_decodes_and_reencodes(name, version, delta_base):
    """The recorded configs decode to their format version (3 and 2, with delta_base written; 1, without it)
    with the recorded fields and re-encode exactly."""
    vec = load(name)
    data = bytes.fromhex(vec["config"])
    cfg = config_fmt.decode(data, where="vector")
    want = vec["decoded"]
    assert (cfg.version, cfg.repo_id, cfg.created, cfg.chunk_bytes, cfg.keyframe_interval) == (
        want["version"], want["repo_id"], want["created"], want["chunk_bytes"], want["keyframe_interval"])
    assert (cfg.version, cfg.delta_base, want.get("delta_base", "parent")) == (version, delta_base, delta_base)
    assert cfg.to_bytes() == data


def test_ref_vector_decodes_and_reencodes():
    """A ref file is the 32-hex version id and a newline, read back as that id."""
    vec = load("ref")
    data = bytes.fromhex(vec["ref"])
    assert refs.decode_ref(data, what="vector") == vec["version_id"]
    assert refs.encode_ref(vec["version_id"]) == data


def _plain(value):
    """A vector's JSON form of msgpack values back to Python (maps as {"map": [[k, v], ...]})."""
    if isinstance(value, dict) and set(value) == {"map"}:
        return {_plain(k): _plain(v) for k, v in value["map"]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def test_event_vectors_decode_and_reencode():
    """Each event record decodes to its fields (ids named by the file's hash) and the fields,
    encoded, give the same bytes: a rollback and a drill record (FORMAT.md §20)."""
    from deltackpt.format import events as events_fmt
    for case in load("event")["cases"]:
        data = bytes.fromhex(case["event"])
        assert hex_id(data) == case["event_id"]
        fields = _plain(case["decoded"])
        event = events_fmt.decode(data, event_id=case["event_id"])
        assert event.kind == fields["kind"] and event.data == fields
        assert events_fmt.encode(fields) == data
