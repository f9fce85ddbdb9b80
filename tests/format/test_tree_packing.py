"""The manifest tree's two packing paths write the same bytes and refuse the same trees: the one
msgpack call a save takes for its manifest (tuples packed through the hook) and the copying path
taken for tuples nested deep or any refusal (format/tree.py)."""

from __future__ import annotations

import random

import torch

from deltackpt.format import tree
from deltackpt.format.tree import TensorRef, pack_tree, unpack_tree


def _random_tree(rng: random.Random, depth: int = 0) -> object:
    r = rng.random()
    if depth > 12 or r < 0.3:   # leaves msgpack takes and ones it refuses (ints past 64 bits, lone surrogates)
        return rng.choice([1, -5, 2**63, 2**64 + 1, "x", "é", "\ud800", b"b", 1.5, None, True,
                           TensorRef(rng.randint(0, 70000)), {1, 2}])
    n = rng.randint(0, 4)
    if r < 0.5:
        return tuple(_random_tree(rng, depth + 1) for _ in range(n))
    if r < 0.75:
        return [_random_tree(rng, depth + 1) for _ in range(n)]
    return {str(i): _random_tree(rng, depth + 1) for i in range(n)}


def _outcome(fn, body) -> tuple[str, object]:
    try:
        return "bytes", fn(body)
    except Exception as exc:   # noqa: BLE001 - the outcome compared is the error's type and text
        return type(exc).__name__, str(exc)


def test_both_paths_write_the_same_bytes_and_refuse_the_same_trees():
    rng = random.Random(7)
    kinds = set()
    for _ in range(5000):
        body = _random_tree(rng)
        got = _outcome(pack_tree, body)
        assert got == _outcome(tree._pack_copying, body), body
        kinds.add(got[0])
    assert {"bytes", "TypeError", "UnicodeEncodeError"} <= kinds   # refusals were among the trees tried
    deep: object = TensorRef(3)
    for _ in range(300):   # far past DIRECT_TUPLE_DEPTH: the copying path, one C call per level avoided
        deep = (deep, [deep] if isinstance(deep, TensorRef) else 1)
    data = pack_tree({"t": deep})
    assert data == tree._pack_copying({"t": deep})
    refs: list[int] = []
    assert unpack_tree(data, what="t", max_bytes=1 << 20, refs=refs) == {"t": deep} and refs == [3, 3]


def test_an_adamw_state_is_packed_without_a_copy(monkeypatch):
    """An optimizer's ``betas`` tuple goes through the hook: the copying path is not taken."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = opt.state_dict()
    body = {"param_groups": state["param_groups"],
            "state": {k: {n: TensorRef(i) for i, n in enumerate(v)} for k, v in state["state"].items()}}
    assert isinstance(body["param_groups"][0]["betas"], tuple)
    expected = tree._pack_copying(body)

    def refuse(_body):
        raise AssertionError("the copying path was taken")
    monkeypatch.setattr(tree, "_pack_copying", refuse)
    assert pack_tree(body) == expected
