"""Bounds checks of the manifest parser: every malformed manifest gives a typed error before any
allocation sized by the input (spec/FORMAT.md, "Threat model")."""

from __future__ import annotations

import msgpack
import pytest

from deltackpt.errors import CorruptObjectError, FormatVersionError, LimitExceededError
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format.ids import hex_id
from deltackpt.format.manifest import Blob, ChunkRef, Manifest, TensorEntry, TensorRef

from ._parser_inputs import CID


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


def _fixture_manifests() -> list[bytes]:
    import os
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures")
    out = []
    for name in ("repo-v1", "repo-v2", "repo-v3"):
        folder = os.path.join(root, name, "manifests")
        for f in sorted(os.listdir(folder)):
            with open(os.path.join(folder, f), "rb") as fh:
                out.append(fh.read())
    return out


def _agrees_on_flipped_bytes(seeds: list[bytes], partial, expected, *, seed: int, tries: int = 3000) -> None:
    """On ``tries`` copies of the seeds with 1-3 bytes flipped, the partial decoder ``partial``
    refuses with a typed error or gives ``expected(m)`` of the whole decode ``m`` wherever the
    whole decoder accepts (a partial decoder may accept more: it checks less); some of each occur."""
    import random
    rng = random.Random(seed)
    agreed = refused = 0
    for _ in range(tries):
        bad = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            bad[rng.randrange(8, len(bad))] = rng.randrange(256)
        try:
            got = partial(bytes(bad))
        except CorruptObjectError:
            got = None
        try:
            m = manifest_fmt.decode(bytes(bad))
        except CorruptObjectError:
            refused += got is None
            continue
        assert got is not None and repr(got) == repr(expected(m))
        agreed += 1
    assert agreed and refused


def test_a_manifests_head_is_what_the_whole_decode_says():
    """decode_head (what ordering a history reads: parent, time, step, metrics) gives exactly the
    whole decoder's values on every fixture manifest and on hand-made ones (tuples and NaN in
    metrics, no step), and on flipped bytes it refuses with a typed error or agrees with the whole
    decoder wherever that one accepts."""
    made = [_manifest(step=7, metrics={"loss": float("nan"), "pair": (1, 2.5), "nested": {"a": [1]}}).to_bytes(),
            _manifest(parent="ab" * 16, time=-0.0).to_bytes()]
    seeds = _fixture_manifests() + made
    for data in seeds:
        m = manifest_fmt.decode(data, version_id=hex_id(data))
        got = manifest_fmt.decode_head(data, version_id=hex_id(data))
        assert repr(got) == repr((m.parent, m.time, m.step, m.metrics))
    _agrees_on_flipped_bytes(seeds, manifest_fmt.decode_head, lambda m: (m.parent, m.time, m.step, m.metrics), seed=5)
    with pytest.raises(CorruptObjectError, match="hash"):
        manifest_fmt.decode_head(seeds[0], version_id="0" * 32)
    with pytest.raises(CorruptObjectError, match="lacks"):
        manifest_fmt.decode_head(_body({"parent": None, "time": 1.0, "tree": {}, "tensors": []}))
    with pytest.raises(CorruptObjectError, match="after"):
        manifest_fmt.decode_head(seeds[0] + b"\xc0")


def _summary_of(m: Manifest) -> tuple:
    """What decode_summary must give, from the whole decode."""
    return (m.parent, m.time, m.step, m.metrics, m.meta, m.extra, m.exact, sum(b.nbytes for b in m.blobs), m.tree)


def _fields(s: manifest_fmt.ManifestSummary) -> tuple:
    return (s.parent, s.time, s.step, s.metrics, s.meta, s.extra, s.exact, s.logical_bytes, s.tree)


def test_a_manifests_summary_is_what_the_whole_decode_says():
    """decode_summary (what ``log`` reads: head, meta, extra, exact, logical bytes, tree) gives exactly
    the whole decoder's values on every fixture manifest and on hand-made ones (a lossy tensor,
    several blobs, tuples in meta, 300 tensors), and on flipped bytes it refuses with a typed error
    or agrees with the whole decoder wherever that one accepts."""
    lossy = TensorEntry("h", ["h"], "float16", [4], [1], 1, 0, "fp16", False, 0.01)
    many = [TensorEntry(f"t{i}", ["t", i], "int8", [1], [1], i, 0) for i in range(300)]
    made = [_manifest(blobs=[Blob(8, 4, 4, [ChunkRef(CID, 8)]), Blob(8, 2, 2, [ChunkRef(CID, 8)])],
                      tensors=[TensorEntry("w", ["w"], "float32", [2], [1], 0, 0), lossy],
                      tree={"w": TensorRef(0), "h": (TensorRef(1), 3)}, meta={"why": ("a", 1)},
                      extra={"written": {"bytes": 5}}, step=3).to_bytes(),
            _manifest(tensors=many, blobs=[Blob(1, 1, 1, [ChunkRef(CID, 1)])] * 300,
                      tree=[TensorRef(i) for i in range(300)]).to_bytes()]
    seeds = _fixture_manifests() + made
    for data in seeds:
        m = manifest_fmt.decode(data, version_id=hex_id(data))
        assert repr(_fields(manifest_fmt.decode_summary(data, version_id=hex_id(data)))) == repr(_summary_of(m))
    assert not manifest_fmt.decode_summary(made[0]).exact and manifest_fmt.decode_summary(made[0]).logical_bytes == 16
    _agrees_on_flipped_bytes(seeds, lambda data: _fields(manifest_fmt.decode_summary(data)), _summary_of, seed=6)


@pytest.mark.parametrize("body,match", [
    ({"time": "yesterday"}, "time is not a number"),
    ({"extra": [1]}, "extra is not a map"),
    ({"blobs": [{"nbytes": -1}]}, "nbytes"),
    ({"blobs": [[8]]}, "not a map"),
    ({"tensors": [{"exact": 1}]}, "exact"),
    ({"tree": {"w": msgpack.ExtType(1, b"\x05")}}, "refers to tensor 5"),
    ({"meta": msgpack.ExtType(9, b"")}, "unknown msgpack ext"),
])
def test_a_summary_refuses_what_it_reads_malformed(body, match):
    """Each field the summary reads is checked as the whole decode checks it, with a typed error."""
    full = {"parent": None, "time": 1.0, "tree": None, "tensors": [{"exact": True}], "blobs": [{"nbytes": 8}]}
    full.update(body)
    with pytest.raises(CorruptObjectError, match=match):
        manifest_fmt.decode_summary(_body(full))


@pytest.mark.parametrize("payload,index", [(b"\x05", 5), (b"\xcc\x05", 5), (b"\xcc\xc8", 200), (b"\xcd\x01\x00", 256),
                                           (b"\xd0\x05", 5), (b"\xce\x00\x01\x00\x00", 65536), (b"\xcb" + b"\x00" * 8, None),
                                           (b"\xff", None), (b"\xcc", None), (b"\xcc\x05\x00", None), (b"\xcd\x01", None)])
def test_every_msgpack_form_of_a_tensor_reference_reads_alike(payload, index):
    """A tensor reference's index reads the same in the short forms writers produce (read by hand)
    and in any other msgpack integer form (the general decoder); anything else is corrupt."""
    tree = {"w": msgpack.ExtType(1, payload)}
    body = {"parent": None, "time": 1.0, "tree": tree, "tensors": [], "blobs": []}
    if index is None:
        with pytest.raises(CorruptObjectError):
            manifest_fmt.decode(_body(body))
        return
    refs: list[int] = []
    from deltackpt.format.tree import unpack_tree
    got = unpack_tree(msgpack.packb(tree, use_bin_type=True), what="t", max_bytes=1 << 20, refs=refs)
    assert got == {"w": TensorRef(index)} and refs == [index]


@pytest.mark.parametrize("key", [["w", ["nested"]], ["w", {"a": 1}], ["w", 1.5], ["w", None], ["w", b"x"],
                                 ["w"] * 513])
def test_a_tensor_key_holds_only_str_and_int(key):
    """A tensor's ``key`` is an array of str and int (spec §9): a nested value, a float, nil, bytes
    or more elements than the tree may nest is a typed error, since plain msgpack decodes it."""
    data = _manifest(tensors=[TensorEntry("w", key, "float32", [2], [1], 0, 0)]).to_bytes()
    with pytest.raises(CorruptObjectError, match="name/key"):
        manifest_fmt.decode(data)
    assert manifest_fmt.decode(_manifest(tensors=[TensorEntry("w", ["w", 0, -1], "float32", [2], [1], 0, 0)])
                               .to_bytes()).tensors[0].key == ["w", 0, -1]
