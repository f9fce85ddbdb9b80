"""The hostile-repository tests' shared pieces: a small real repository (``template``), a fresh
copy of it next to a canary folder checked after each test (``env``), and raw index rewriting."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
import torch

import deltackpt
from deltackpt.format import index as index_fmt
from deltackpt.format import pack as pack_fmt


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g), "step": seed}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hostile") / "repo")
    for i in range(3):
        base = _state(0)
        if i:
            base["w"] = base["w"] + 1e-3 * i  # small moves: delta chunks
        deltackpt.save(base, path, step=i)
    deltackpt.api._OPEN.clear()
    return path


def _snapshot(folder: str) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            body = b""
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    body = f.read()
            out[os.path.relpath(p, folder)] = (st.st_mode, st.st_size, st.st_mtime_ns, hashlib.sha1(body).hexdigest())
    return out


@pytest.fixture
def env(template, tmp_path):
    """A fresh copy of the template repository and an 'outside' folder holding a canary and a copy
    of every repository file (so a followed link would find valid bytes and succeed visibly)."""
    root = str(tmp_path / "repo")
    outside = str(tmp_path / "outside")
    shutil.copytree(template, root)
    shutil.copytree(template, os.path.join(outside, "mirror"))
    with open(os.path.join(outside, "canary"), "w") as f:
        f.write("canary")
    before = _snapshot(outside)
    deltackpt.api._OPEN.clear()
    yield root, outside
    deltackpt.api._OPEN.clear()
    assert _snapshot(outside) == before, "something outside the repository was written"


def _keys(root: str, prefix: str) -> list[str]:
    out = []
    for dirpath, _d, names in os.walk(os.path.join(root, prefix)):
        out += [os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/") for n in names]
    return sorted(out)


def _latest(root: str) -> str:
    with open(os.path.join(root, "refs", "latest")) as f:
        return f.read().strip()



def _rewrite_index(root: str, edit) -> None:
    """Apply ``edit(pack_id, entries) -> entries`` to every index file, keeping checksums valid."""
    for key in _keys(root, "index"):
        path = os.path.join(root, key)
        with open(path, "rb") as f:
            packs = index_fmt.decode(f.read())
        new = {pid: (plen, edit(pid, plen, entries)) for pid, (plen, entries) in packs.items()}
        with open(path, "wb") as f:
            f.write(index_fmt.encode(new))


def _replace(e: pack_fmt.PackEntry, **kw) -> pack_fmt.PackEntry:
    d = dict(chunk_id=e.chunk_id, offset=e.offset, length=e.length, encoding=e.encoding, raw_len=e.raw_len,
             base=e.base, depth=e.depth)
    d.update(kw)
    return pack_fmt.PackEntry(**d)
