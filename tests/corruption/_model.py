"""The real repository every corruption case damages a copy of, and independent bookkeeping of
which versions need which bytes (computed from the pristine files, not from verify's code)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import torch

import deltackpt
from deltackpt.format import index as index_fmt
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format import pack as pack_fmt
from deltackpt.torchstate.flatten import flatten

ENCODINGS = [None, None, {"optimizer.*": "q8-delta"}, None, {"model.3.*": "fp16"}, None, None]


def build(path: str) -> None:
    """Seven versions of a real model trained with AdamW: keyframes, XOR/sub/sparse deltas, a q8
    delta and an fp16 cast, one pack and one index file per save."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, enc in enumerate(ENCODINGS):
        idx = torch.randint(0, 8, (16,))  # a few embedding rows move: sparse deltas
        loss = model(idx).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path,
                       step=step, encoding=enc, tag="first" if step == 0 else None)


def state_digest(state) -> str:
    """A digest of everything a load returns: the tree and every tensor's dtype, shape and bytes."""
    tree, leaves = flatten(state)
    h = hashlib.sha256(repr(tree).encode())
    for leaf in leaves:
        t = leaf.tensor
        h.update(f"{leaf.name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class Pristine:
    path: str
    versions: list[str]                                # oldest first
    digests: dict[str, str]                            # version -> state digest
    files: dict[str, list[str]]                        # category -> store keys
    refs: dict[str, str]                               # ref key -> version
    pack_entries: dict[str, list[pack_fmt.PackEntry]]  # pack key -> entries
    index_chunks: dict[str, set[bytes]] = field(default_factory=dict)   # index key -> chunk ids
    closure: dict[str, set[bytes]] = field(default_factory=dict)        # version -> chunks incl. bases

    def users(self, chunks: set[bytes]) -> set[str]:
        return {v for v, need in self.closure.items() if need & chunks}


def _keys(root: str, prefix: str) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(os.path.join(root, prefix)):
        for n in names:
            out.append(os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/"))
    return sorted(out)


def survey(path: str) -> Pristine:
    """Read the pristine repository with the format parsers alone."""
    def read(key: str) -> bytes:
        with open(os.path.join(path, key), "rb") as f:
            return f.read()

    files = {"pack": _keys(path, "packs"), "index": _keys(path, "index"), "manifest": _keys(path, "manifests"),
             "ref": _keys(path, "refs")}
    pack_entries = {k: pack_fmt.parse_pack(read(k)) for k in files["pack"]}
    base: dict[bytes, bytes | None] = {}
    for entries in pack_entries.values():
        for e in entries:
            assert e.chunk_id not in base, "a chunk stored twice would blur the expected sets"
            base[e.chunk_id] = e.base
    index_chunks = {k: {e.chunk_id for _p, (_l, es) in index_fmt.decode(read(k)).items() for e in es}
                    for k in files["index"]}
    manifests = {k.rsplit("/", 1)[-1]: manifest_fmt.decode(read(k)) for k in files["manifest"]}
    closure = {}
    for vid, m in manifests.items():
        need: set[bytes] = set()
        for blob in m.blobs:
            for c in blob.chunks:
                cur: bytes | None = c.chunk_id
                while cur is not None and cur not in need:
                    need.add(cur)
                    cur = base[cur]
        closure[vid] = need
    versions = sorted(manifests, key=lambda v: manifests[v].step)
    refs = {k: read(k).decode().strip() for k in files["ref"]}
    digests = {v: state_digest(deltackpt.load(path, v)) for v in versions}
    return Pristine(path, versions, digests, files, refs, pack_entries, index_chunks, closure)
