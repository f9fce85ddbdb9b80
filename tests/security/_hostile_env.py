"""The hostile-repository tests' shared helpers: the template's states, a folder snapshot (what
``env`` in conftest.py checks after each test) and raw index rewriting."""

from __future__ import annotations

import hashlib
import os

import torch

from deltackpt.format import index as index_fmt
from deltackpt.format import pack as pack_fmt


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g), "step": seed}


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
