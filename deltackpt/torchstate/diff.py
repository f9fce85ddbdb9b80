"""Per-tensor differences between two versions."""

from __future__ import annotations

from typing import Any

import torch

from .materialize import build_tensors, read_blobs


def _stats(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"changed_fraction": 1.0, "max_abs": None, "rel_l2": None, "note": "shape or dtype changed"}
    if a.numel() == 0:
        return {"changed_fraction": 0.0, "max_abs": 0.0, "rel_l2": 0.0}
    bits_a = a.reshape(-1).view(torch.uint8).reshape(a.numel(), -1)
    bits_b = b.reshape(-1).view(torch.uint8).reshape(b.numel(), -1)
    changed = (bits_a != bits_b).any(dim=1).float().mean().item()
    if a.is_floating_point() or a.is_complex() or a.dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                                torch.uint8):
        try:
            da, db = a.to(torch.complex128 if a.is_complex() else torch.float64), b.to(
                torch.complex128 if b.is_complex() else torch.float64)
            d = (db - da).abs()
            finite = torch.isfinite(d)
            max_abs = d[finite].max().item() if finite.any() else 0.0
            norm = da.abs().pow(2).sum().sqrt().item()
            rel = (d[finite].pow(2).sum().sqrt().item() / norm) if norm else (0.0 if max_abs == 0 else float("inf"))
            return {"changed_fraction": changed, "max_abs": max_abs, "rel_l2": rel}
        except (RuntimeError, TypeError):
            pass
    return {"changed_fraction": changed, "max_abs": None, "rel_l2": None}


def diff_versions(repo: Any, a: Any, b: Any) -> list[dict[str, Any]]:
    core = repo.core
    va, vb = core.resolve(a), core.resolve(b)
    ma, mb = core.manifest(va), core.manifest(vb)
    core.refresh_index()
    ia = {t.name: i for i, t in enumerate(ma.tensors)}
    ib = {t.name: i for i, t in enumerate(mb.tensors)}
    rows = []
    for name in sorted(set(ia) | set(ib)):
        row: dict[str, Any] = {"name": name}
        for label, m, idx in (("a", ma, ia), ("b", mb, ib)):
            if name in idx:
                blob = m.blobs[m.tensors[idx[name]].blob]
                row[f"stored_bytes_{label}"] = core.stored_size(c.chunk_id for c in blob.chunks)
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
    return rows
