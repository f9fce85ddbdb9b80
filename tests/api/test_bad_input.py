"""Bad input from users (issue 5): every leaf either round-trips bit-identically or is refused at
save time with an UnsupportedLeafError naming the path and what to do, leaving the repository
exactly as it was (no new version, no stray manifest, pack or index file)."""

from __future__ import annotations

import collections
import enum
import functools
import os

import numpy as np
import pytest
import torch

import deltackpt
from deltackpt.errors import UnsupportedLeafError
from tests.conftest import file_digests


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


class MyTensor(torch.Tensor):
    pass


class Thing:
    pass




@pytest.fixture
def repo(repo_path):
    deltackpt.save({"w": torch.arange(6.0)}, repo_path, step=0)
    return repo_path


def _self_ref():
    d: dict = {"t": torch.ones(1)}
    d["me"] = d
    return d


def _quantized():
    return torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)


REFUSED = {
    "set": ({"opt": {"s": {1, 2}}}, "opt.s", "plain types"),
    "frozenset": ({"f": frozenset([1])}, "f", "plain types"),
    "numpy_array": ({"a": np.zeros(3)}, "a", "torch.from_numpy"),
    "numpy_scalar": ({"a": np.float32(1.0)}, "a", "item()"),
    "custom_object": ({"cfg": {"obj": Thing()}}, "cfg.obj", "plain types"),
    "lambda": ({"fn": lambda x: x}, "fn", "without pickle"),
    "complex_number": ({"c": 1 + 2j}, "c", "plain types"),
    "int_above_64_bits": ({"n": 1 << 64}, "n", "as a str"),
    "int_below_64_bits": ({"n": -(1 << 63) - 1}, "n", "as a str"),
    "meta_tensor": ({"m": torch.empty(3, device="meta")}, "m", "materialize"),
    "sparse_coo": ({"s": torch.eye(3).to_sparse()}, "s", "to_dense"),
    "sparse_csr": ({"s": torch.eye(3).to_sparse_csr()}, "s", "to_dense"),
    "quantized": ({"q": _quantized()}, "q", "int_repr"),
    # issue 23 item 12: a plain tensor viewed as a quantized dtype raised torch's raw RuntimeError
    "quint8_view": ({"opt": {"q": torch.arange(8, dtype=torch.uint8).view(torch.quint8)}}, "opt.q", "view(torch.uint8)"),
    "qint8_view": ({"q": torch.arange(8, dtype=torch.uint8).view(torch.qint8)}, "q", "quantized dtype qint8"),
    "qint32_view": ({"q": torch.arange(8, dtype=torch.int32).view(torch.qint32)}, "q", "int_repr"),
    "quint4x2_view": ({"q": torch.arange(8, dtype=torch.uint8).view(torch.quint4x2)}, "q", "view(torch.uint8)"),
    "tensor_subclass": ({"t": torch.ones(2).as_subclass(MyTensor)}, "t", "as_subclass"),
    "nested_tensor": ({"n": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, "n", "unbind"),
    "module": ({"m": torch.nn.Linear(2, 2)}, "m", "state_dict"),
    "dtype_value": ({"d": torch.float32}, "d", "str(value)"),
    "tuple_key": ({"k": {(1, 2): 3}}, "k", "str or int keys"),
    "float_key": ({1.5: 3}, "<root>", "str or int keys"),
    "none_key": ({None: 3}, "<root>", "str or int keys"),
    "bool_key": ({True: 3}, "<root>", "str or int keys"),
    "bytes_key": ({b"k": 3}, "<root>", "str or int keys"),
    "big_int_key": ({1 << 70: torch.ones(1)}, "<root>", "str key"),
    "namedtuple": ({"nt": collections.namedtuple("P", "x y")(1, 2)}, "nt", "plain types"),
    "too_deep": ({"d": functools.reduce(lambda acc, _: [acc], range(600), [])}, "", "levels"),
    "too_deep_dicts": (functools.reduce(lambda acc, _: {"k": acc}, range(600), {}), "", "levels"),
    "contains_itself": (_self_ref(), "me.me.me", "nested deeper"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_leaf_is_refused_and_repository_unchanged(repo, name):
    """An unsupported value raises UnsupportedLeafError naming its path and a fix; nothing is written."""
    obj, path, hint = REFUSED[name]
    before = file_digests(repo)
    with pytest.raises(UnsupportedLeafError) as info:
        deltackpt.save(obj, repo, step=1)
    msg = str(info.value)
    assert msg.startswith(path), msg
    assert hint in msg, msg
    after = file_digests(repo)
    assert after == before
    assert len(deltackpt.Repo(repo).log()) == 1


@pytest.mark.parametrize("mode", ["blocking", "thread", "process"])
def test_a_quantized_dtype_view_is_refused_before_a_background_save_starts(repo, mode):
    """issue 23 item 12, every save path: the refusal is raised by save() itself, naming the tensor."""
    before = file_digests(repo)
    kwargs = {} if mode == "blocking" else {"blocking": False, "background": mode}
    with pytest.raises(UnsupportedLeafError, match="^model.q: quantized dtype quint8"):
        deltackpt.save({"model": {"q": torch.zeros(4, dtype=torch.uint8).view(torch.quint8)}}, repo, **kwargs)
    assert file_digests(repo) == before


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (list(a), list(b))
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert type(a) is type(b) and (a == b or (a != a and b != b)), (a, b)


ROUND_TRIPS = {
    "dotted_key_clash": {"a.b": torch.ones(2), "a": {"b": torch.zeros(3)}},
    "hash_names": {"layer#1": torch.ones(1), "layer": {"1": torch.full((2,), 2.0)}, "1#2": torch.ones(4),
                   "1": torch.zeros(5), 1: torch.full((6,), 7.0)},
    "separators_and_unicode": {"ü.名前": torch.ones(2), "a/b": torch.ones(1), "x y": 1, "": torch.ones(3),
                               "..": torch.zeros(1), "#": "hash", "tab\tnew\nline": torch.ones(1)},
    "int_and_str_keys": {0: torch.ones(1), "0": torch.zeros(1), -5: "neg", (1 << 64) - 1: "max"},
    "plain_values": {"none": None, "t": True, "f": 1.5, "nan": float("nan"), "inf": float("-inf"), "b": b"\x00\xff",
                     "big": (1 << 64) - 1, "small": -(1 << 63), "tuple": (1, (2, "x")), "list": [[], {}],
                     "empty": {}},
    "zero_dim_and_empty": {"s": torch.tensor(3.5), "e": torch.empty(0, 4), "i": torch.tensor([], dtype=torch.int64)},
    "parameter_and_views": {"p": torch.nn.Parameter(torch.ones(4)), "v": torch.arange(10.0)[2:8:2]},
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_supported_oddities_round_trip(repo_path, name):
    """Clashing dotted names, '#', separators, unicode, mixed int/str keys and plain values round-trip exactly."""
    obj = ROUND_TRIPS[name]
    v = deltackpt.save(obj, repo_path)
    out = deltackpt.load(repo_path, v.id)
    expect = {k: (t.detach() if isinstance(t, torch.nn.Parameter) else t) for k, t in obj.items()}
    _same(expect, out)


def test_tensor_names_stay_unique(repo_path):
    """Keys that flatten to the same dotted name get distinct tensor names (restore looks tensors up by name)."""
    deltackpt.save(ROUND_TRIPS["hash_names"], repo_path)
    names = [t["name"] for t in deltackpt.Repo(repo_path).show()["tensors"]]
    assert len(names) == len(set(names)), names


def test_subclasses_of_plain_types_are_saved_as_their_base_type(repo_path):
    """IntEnum, str and bytes subclasses (leaves and keys) are saved as int, str and bytes; no pickle."""
    obj = {"c": Color.RED, Name("k"): Name("v"), "b": type("B", (bytes,), {})(b"xy"), Color.RED: torch.ones(1)}
    deltackpt.save(obj, repo_path)
    out = deltackpt.load(repo_path)
    assert out == {"c": 1, "k": "v", "b": b"xy", 1: out[1]} and torch.equal(out[1], torch.ones(1))
    assert [type(x) for x in (out["c"], out["k"], out["b"])] == [int, str, bytes]
    assert [type(k) for k in out] == [str, str, str, int]


def test_ordered_and_default_dicts_come_back_as_dicts(repo_path):
    """Mapping types other than dict are saved as plain dicts with their order kept."""
    obj = {"o": collections.OrderedDict([("z", 1), ("a", torch.ones(1))]), "d": collections.defaultdict(int, x=2)}
    deltackpt.save(obj, repo_path)
    out = deltackpt.load(repo_path)
    assert list(out["o"]) == ["z", "a"] and out["d"] == {"x": 2} and type(out["d"]) is dict


def test_conj_and_neg_views_are_saved_resolved(repo_path):
    """Lazily conjugated / negated views are stored with their values resolved."""
    z = torch.complex(torch.arange(3.0), torch.ones(3))
    obj = {"c": z.conj(), "n": torch._neg_view(torch.arange(3.0))}
    deltackpt.save(obj, repo_path)
    out = deltackpt.load(repo_path)
    assert torch.equal(out["c"], z.conj().resolve_conj()) and torch.equal(out["n"], -torch.arange(3.0))


def _listing(root: str) -> list[str]:
    """The repository's packs, index files and manifests."""
    return sorted(os.path.relpath(os.path.join(d, f), root) for sub in ("packs", "index", "manifests")
                  for d, _dirs, files in os.walk(os.path.join(root, sub)) for f in files)


UNSTORABLE = {   # save kwargs (a changed tensor, so a save that got further would write a pack), words in the error
    "step_above_64_bits": (dict(step=1 << 64), ["step", "64 bits"]),
    "step_below_64_bits": (dict(step=-(1 << 63) - 1), ["step", "64 bits"]),
    "step_of_5000_digits": (dict(step=10 ** 5000), ["step", "bits"]),
    "metric_above_64_bits": (dict(metrics={"tokens": 1 << 70}), ["tokens", "64 bits"]),
    "metric_name_surrogate": (dict(metrics={"loss\ud800": 1.0}), ["metric name", "surrogate", "\\ud800"]),
    "meta_surrogate": (dict(meta={"note": "x\udc00"}), ["meta.note", "surrogate"]),
    "meta_key_surrogate": (dict(meta={"\ud83d": 1}), ["meta", "dict key", "surrogate"]),
    "meta_int_of_5000_digits": (dict(meta={"n": 10 ** 5000}), ["meta.n", "bits"]),
    "value_surrogate": (dict(obj={"w": torch.ones(9), "cfg": {"name": ["ok", "a\udfffb"]}}), ["cfg.name.1", "surrogate"]),
    "key_surrogate": (dict(obj={"w": torch.ones(9), "cfg": {"\udc80": torch.ones(2)}}), ["cfg", "dict key", "surrogate"]),
    "str_subclass_surrogate": (dict(obj={"w": torch.ones(9), "s": Name("\ud800")}), ["s", "surrogate"]),
}


@pytest.mark.parametrize("name", sorted(UNSTORABLE))
def test_unstorable_step_metric_or_text_is_refused_before_the_first_pack(repo, name):
    """A step or metric beyond 64 bits, or a lone surrogate in a key, value, meta or metric name,
    raises UnsupportedLeafError naming it (printable) and leaves no new pack, index file or manifest."""
    kwargs, words = UNSTORABLE[name]
    kwargs = dict(kwargs)
    obj = kwargs.pop("obj", {"w": torch.arange(9.0)})   # differs from the saved version: it would be written
    before = _listing(repo)
    with pytest.raises(UnsupportedLeafError) as info:
        deltackpt.save(obj, repo, **kwargs)
    msg = str(info.value)
    msg.encode("utf-8")   # the message itself prints on any terminal
    for w in words:
        assert w in msg, msg
    assert _listing(repo) == before
    assert len(deltackpt.Repo(repo).log()) == 1


@pytest.mark.parametrize("tree", [{"n": 1 << 64}, {"\udc80": 1}, ["\ud800"]])
def test_repository_layer_refuses_an_unstorable_tree_before_writing(repo, tree):
    """saver.write_version (any writer below the frontend) refuses a tree msgpack cannot encode
    before its pack is written, as UnsupportedLeafError."""
    from deltackpt.repo.repository import Repository
    from deltackpt.repo.write import saver
    from deltackpt.repo.write.session import WriteSession
    session = WriteSession(Repository(repo))
    blob = saver.BlobInput(("w",), bytes(range(256)) * 64, "uint8", 1, 256)
    before = _listing(repo)
    with pytest.raises(UnsupportedLeafError, match="tree"):
        saver.write_version(session, [blob], [], tree, step=2)
    assert _listing(repo) == before
