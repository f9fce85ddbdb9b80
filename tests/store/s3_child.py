"""Child process for the S3 crash and concurrency tests: saves to an s3:// repository.

usage: python -m tests.store.s3_child URL SEED STEPS [ROWS]
Each step saves a fresh random state tagged by step ``SEED*1000 + i`` and prints the version id.
"""

from __future__ import annotations

import sys

import torch

import deltackpt


def main() -> None:
    url, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rows = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        state = {"w": torch.randn(rows, 256, generator=g), "writer": seed, "i": i}
        v = deltackpt.save(state, url, step=seed * 1000 + i)
        print(v.id, flush=True)


if __name__ == "__main__":
    main()
