"""Import the atheris targets in fuzz/ as plain modules (no atheris needed)."""

from __future__ import annotations

import importlib
import os
import sys

FUZZ_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fuzz")
TARGETS = ("manifest", "pack", "index", "objects", "refs", "config")


def target(name: str):
    if FUZZ_DIR not in sys.path:
        sys.path.insert(0, FUZZ_DIR)
    return importlib.import_module(f"fuzz_{name}")


def corpus(name: str) -> list[tuple[str, bytes]]:
    folder = os.path.join(FUZZ_DIR, "corpus", name)
    out = []
    for fname in sorted(os.listdir(folder)):
        with open(os.path.join(folder, fname), "rb") as f:
            out.append((fname, f.read()))
    return out
