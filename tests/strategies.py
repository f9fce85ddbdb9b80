"""Hypothesis strategies shared by the test suite: every torch dtype, 0-d and empty shapes,
non-contiguous views, storage sharing, nested states."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from deltackpt.torchstate.dtypes import FROM_NAME
from deltackpt.torchstate.tensor_bytes import bits_of

ALL_DTYPES = sorted(FROM_NAME.values(), key=str)
"""Every dtype the format names that this torch build has (float8 kinds, complex, uints, bits...)."""

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3)


@st.composite
def raw_tensors(draw, dtype=None, shape=None):
    """A tensor of ``dtype`` whose bytes are arbitrary: NaN payloads, -0.0, subnormals, infinities."""
    dtype = draw(st.sampled_from(ALL_DTYPES)) if dtype is None else dtype
    shape = draw(shapes) if shape is None else shape
    itemsize = torch.empty(0, dtype=dtype).element_size()
    n = 1
    for d in shape:
        n *= d
    special = st.sampled_from([b"\x00", b"\xff", b"\x80", b"\x7f", b"\x01"])
    data = draw(st.one_of(st.binary(min_size=n * itemsize, max_size=n * itemsize),
                          special.map(lambda b: b * (n * itemsize))))
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    if dtype == torch.bool:
        t = t & 1  # bool tensors hold only 0/1 bytes
    return t.view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)


@st.composite
def views(draw):
    """Non-contiguous and offset views: transposes, slices with steps, expanded dims."""
    base = draw(raw_tensors(shape=draw(st.lists(st.integers(1, 6), min_size=2, max_size=3))))
    kind = draw(st.sampled_from(["t", "step", "narrow", "expand"]))
    if kind == "t":
        return base.transpose(0, 1)
    if kind == "step":
        return base[::2]
    if kind == "narrow":
        return base.narrow(0, base.shape[0] // 2, base.shape[0] - base.shape[0] // 2)
    return base[:1].expand(3, *base.shape[1:])


plain_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
                         st.floats(allow_nan=True), st.text(max_size=8), st.binary(max_size=8))


@st.composite
def states(draw, max_leaves=6):
    """Nested dicts/lists/tuples of tensors, views and plain leaves, some tensors sharing storage."""
    leaves = draw(st.lists(st.one_of(raw_tensors(), views(), plain_leaves), min_size=1, max_size=max_leaves))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor) and x.numel() > 1]
    if tensors and draw(st.booleans()):
        src = tensors[0]
        leaves.append(src)                      # the same tensor twice (tied weights)
        if src.is_contiguous():
            leaves.append(src.reshape(-1)[1:])  # an overlapping view of its storage
    keys = [f"k{i}" for i in range(len(leaves))]
    layout = draw(st.sampled_from(["flat", "nested", "list", "tuple"]))
    if layout == "flat":
        return dict(zip(keys, leaves))
    if layout == "nested":
        half = len(leaves) // 2
        return {"model": dict(zip(keys[:half], leaves[:half])), "rest": {"x": list(leaves[half:])}, "step": 3}
    if layout == "list":
        return {"items": list(leaves)}
    return {"items": tuple(leaves)}


def clone_state(obj):
    """A deep copy of a state's tensors (detached), structure kept: what a save must reproduce
    after training goes on changing the live tensors."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_state(v) for v in obj)
    return obj


def assert_bit_identical(a, b, path="") -> None:
    """Same structure, same dtypes and shapes, same bytes (NaN payloads and -0.0 included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: expected a tensor, got {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if a.numel():
            ab = bits_of(a).contiguous().reshape(-1).view(torch.uint8)
            bb = bits_of(b).contiguous().reshape(-1).view(torch.uint8)
            assert torch.equal(ab, bb), f"{path}: bytes differ"
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} vs {list(b) if isinstance(b, dict) else b}"
        for k in a:
            assert_bit_identical(a[k], b[k], f"{path}.{k}")
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {type(a).__name__}[{len(a)}] vs {type(b).__name__}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bit_identical(x, y, f"{path}.{i}")
        return
    if isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, f"{path}: NaN became {b!r}"
        return
    assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"
