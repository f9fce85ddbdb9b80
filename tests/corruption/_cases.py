"""Deterministic damage cases: bit flips, truncations, zeroed 4 KiB blocks and deletions of packs,
index files, manifests and refs.

A case names its file by position (``pack #3``) and its place by a fraction of the file's length,
so the list is fixed at collection time and resolved against the real repository at run time.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

BLOCK = 4096

# cases per (category, kind) in the full run (1016 in all)
COUNTS = {
    "pack": {"bitflip": 220, "truncate": 100, "zero4k": 100, "delete": 8},
    "index": {"bitflip": 100, "truncate": 60, "zero4k": 40, "delete": 8},
    "manifest": {"bitflip": 150, "truncate": 80, "zero4k": 40, "delete": 8},
    "ref": {"bitflip": 60, "truncate": 30, "zero4k": 10, "delete": 2},
}
FAST_EVERY = 8  # the default suite runs every 8th case (127)


@dataclass(frozen=True)
class Case:
    category: str
    kind: str
    file_no: int
    where: float  # fraction of the file's length
    bit: int

    @property
    def id(self) -> str:
        return f"{self.category}{self.file_no}-{self.kind}-{self.where:.4f}-{self.bit}"


def all_cases() -> list[Case]:
    rnd = random.Random(20261122)
    out = []
    for category, kinds in COUNTS.items():
        for kind, n in kinds.items():
            for j in range(n):
                file_no = j if kind == "delete" else rnd.randrange(1 << 20)
                out.append(Case(category, kind, file_no, rnd.random(), rnd.randrange(8)))
    return out


def selected_cases() -> list[Case]:
    cases = all_cases()
    if os.environ.get("DELTACKPT_RELIABILITY") == "full":
        return cases
    return cases[::FAST_EVERY]


def apply(case: Case, root: str, key: str) -> tuple[int, int] | None:
    """Damage ``key`` under ``root``; return the damaged byte range [start, end) (None: deleted)."""
    path = os.path.join(root, key)
    if case.kind == "delete":
        os.unlink(path)
        return None
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = len(data)
    if case.kind == "bitflip":
        off = min(int(case.where * n), n - 1)
        data[off] ^= 1 << case.bit
        rng = (off, off + 1)
    elif case.kind == "truncate":
        # refs: keep the cut inside the id (dropping only the newline is harmless by design)
        limit = n - 2 if key.startswith("refs/") else n - 1
        cut = min(int(case.where * (limit + 1)), limit)
        data = data[:cut]
        rng = (cut, n)
    else:  # zero4k: the first block at or after the chosen one that is not all zeros already
        nblocks = (n + BLOCK - 1) // BLOCK
        first = min(int(case.where * nblocks), nblocks - 1)
        for b in list(range(first, nblocks)) + list(range(0, first)):
            lo, hi = b * BLOCK, min((b + 1) * BLOCK, n)
            if any(data[lo:hi]):
                data[lo:hi] = bytes(hi - lo)
                rng = (lo, hi)
                break
        else:
            raise AssertionError(f"{key} is all zeros")
    with open(path, "wb") as f:
        f.write(data)
    return rng
