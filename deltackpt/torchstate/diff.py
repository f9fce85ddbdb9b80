"""Per-tensor differences between two versions."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Iterator, Protocol, TypedDict, cast

import torch

from .materialize import build_tensors, read_blobs

if TYPE_CHECKING:
    from ..repo.repository import Repository
    from ..repo.versions import Version


class _Opened(Protocol):
    """A repository handle (:class:`deltackpt.Repo`), as far as a diff uses it."""

    @property
    def core(self) -> Repository: ...


PIECE_ELEMENTS = 1 << 22
"""Elements compared at once: memory for a comparison stays a few tens of MB, whatever the tensor."""

MAX_COMPARED_ELEMENTS = 1 << 32
"""A pair needing more element comparisons than this, once dimensions both sides broadcast are
collapsed, is reported as not compared (minutes of work for an informational figure)."""


class _Named(TypedDict):
    name: str


class TensorDiff(_Named, total=False):
    """One tensor's row of :meth:`deltackpt.Repo.diff`: its stored bytes in version a and b (a
    tensor in one version only has ``status`` ``"added"`` or ``"removed"`` and one of them), the
    fraction of elements changed, the largest absolute and the relative L2 difference (None when
    not numeric or not compared; ``note`` says why)."""

    stored_bytes_a: int
    stored_bytes_b: int
    changed_fraction: float | None
    max_abs: float | None
    rel_l2: float | None
    note: str
    status: str


def _collapse_broadcast(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` narrowed to one index along every dimension where both have stride 0: their
    values repeat along it, so every figure ``_stats`` reports (a fraction, a maximum, a ratio of
    norms) is the same over one index as over all of them.  A stride-0 view of 2^36 elements
    compares as one element, without being expanded."""
    for d in range(a.dim()):
        if a.shape[d] > 1 and a.stride(d) == 0 and b.stride(d) == 0:
            a, b = a.narrow(d, 0, 1), b.narrow(d, 0, 1)
    return a, b


def _pieces(a: torch.Tensor, b: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Matching views of ``a`` and ``b`` of at most about PIECE_ELEMENTS elements each, covering both."""
    shape = list(a.shape)
    split = len(shape)   # the dims from ``split`` on fit in one piece
    while split > 0 and math.prod(shape[split - 1:]) <= PIECE_ELEMENTS:
        split -= 1
    if split == 0:
        yield a, b
        return
    inner = math.prod(shape[split:])
    step = max(1, PIECE_ELEMENTS // inner)
    for outer in itertools.product(*(range(n) for n in shape[:split - 1])):
        pa, pb = a[outer], b[outer]
        for start in range(0, shape[split - 1], step):
            yield pa.narrow(0, start, min(step, shape[split - 1] - start)), pb.narrow(0, start, min(step, shape[split - 1] - start))


def _bytes_per_element(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as rows of their bytes (a copy only where ``t`` is not laid out densely)."""
    flat = t.reshape(-1)
    if flat.stride(0) != 1:   # a single element narrowed out of a stride-0 view keeps stride 0
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).reshape(flat.numel(), -1)


def _numeric(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex() or t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                                   torch.uint8)


def _stats(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"changed_fraction": 1.0, "max_abs": None, "rel_l2": None, "note": "shape or dtype changed"}
    if a.numel() == 0:
        return {"changed_fraction": 0.0, "max_abs": 0.0, "rel_l2": 0.0}
    a, b = _collapse_broadcast(a, b)
    n = a.numel()
    if n > MAX_COMPARED_ELEMENTS:
        return {"changed_fraction": None, "max_abs": None, "rel_l2": None,
                "note": f"not compared: {n} elements to compare (over {MAX_COMPARED_ELEMENTS})"}
    changed, numeric = 0, _numeric(a)
    max_abs, any_finite, sq_diff, sq_a = 0.0, False, 0.0, 0.0
    wide = torch.complex128 if a.is_complex() else torch.float64
    for pa, pb in _pieces(a, b):
        bits_a, bits_b = _bytes_per_element(pa), _bytes_per_element(pb)
        changed += int((bits_a != bits_b).any(dim=1).sum().item())
        if not numeric:
            continue
        try:
            da, db = pa.to(wide), pb.to(wide)
        except (RuntimeError, TypeError):
            numeric = False
            continue
        d = (db - da).abs()
        finite = d[torch.isfinite(d)]
        if finite.numel():
            any_finite = True
            max_abs = max(max_abs, finite.max().item())
            sq_diff += finite.pow(2).sum().item()
        sq_a += da.abs().pow(2).sum().item()
    out = {"changed_fraction": changed / n, "max_abs": None, "rel_l2": None}
    if numeric:
        max_abs = max_abs if any_finite else 0.0
        norm = math.sqrt(sq_a)
        out["max_abs"] = max_abs
        out["rel_l2"] = (math.sqrt(sq_diff) / norm) if norm else (0.0 if max_abs == 0 else float("inf"))
    return out


def diff_versions(repo: _Opened, a: "str | Version", b: "str | Version") -> list[TensorDiff]:
    core = repo.core
    va, vb = core.resolve(a), core.resolve(b)
    ma, mb = core.manifest(va), core.manifest(vb)
    core.index.refresh()
    ia = {t.name: i for i, t in enumerate(ma.tensors)}
    ib = {t.name: i for i, t in enumerate(mb.tensors)}
    rows = []
    for name in sorted(set(ia) | set(ib)):
        row: dict[str, Any] = {"name": name}
        for label, m, idx in (("a", ma, ia), ("b", mb, ib)):
            if name in idx:
                blob = m.blobs[m.tensors[idx[name]].blob]
                row[f"stored_bytes_{label}"] = core.index.stored_size(c.chunk_id for c in blob.chunks)
        if name in ia and name in ib:
            ea, eb = ma.tensors[ia[name]], mb.tensors[ib[name]]
            if [c.chunk_id for c in ma.blobs[ea.blob].chunks] == [c.chunk_id for c in mb.blobs[eb.blob].chunks] \
                    and ea.offset == eb.offset and ea.shape == eb.shape and ea.dtype == eb.dtype:
                row.update({"changed_fraction": 0.0, "max_abs": 0.0, "rel_l2": 0.0})
            else:
                ta = build_tensors(ma, [ia[name]], read_blobs(core, va, ma, [ea.blob]))[ia[name]]
                tb = build_tensors(mb, [ib[name]], read_blobs(core, vb, mb, [eb.blob]))[ib[name]]
                row.update(_stats(ta, tb))
        else:
            row["status"] = "added" if name in ib else "removed"
        rows.append(row)
    return cast("list[TensorDiff]", rows)   # the rows are built key by key (stored_bytes_a / _b)
