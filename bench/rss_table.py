"""Peak RSS of one save and one load per system, each in a fresh child process (bench.rss).

    python -m bench.rss_table            # minilm-frozen first version; prints a Markdown table
"""

import os
import sys
import tempfile

import torch

from bench.measure import rss
from bench.systems import systems
from bench.workloads import minilm


def main() -> None:
    state = next(minilm(1, frozen=True))
    with tempfile.TemporaryDirectory(prefix="deltackpt-rss-") as tmp:
        pt = os.path.join(tmp, "state.pt")
        torch.save(state, pt)
        del state
        print("| system | save peak MiB | save extra MiB | load peak MiB | load extra MiB |\n|---|---|---|---|---|")
        for s in systems():
            d = os.path.join(tmp, s.name)
            sv, ld = rss("save", s.name, pt, d), rss("load", s.name, pt, d)
            if sv and ld:
                print(f"| {s.name} | {sv['peak']:.0f} | {sv['peak'] - sv['base']:.0f} | {ld['peak']:.0f} | {ld['peak'] - ld['base']:.0f} |", flush=True)
            else:
                print(f"| {s.name} | failed | | | |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
