"""Text and JSON output for the CLI."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Sequence

#: a CLI error is one line; a longer message (another library's) is cut here
MAX_MESSAGE = 2000


def one_line(text: str) -> str:
    """Messages of other libraries (torch, safetensors) span lines; a CLI error is one."""
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " ..."


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def when(t: float) -> str:
    """Local time of a unix time; "?" for one no calendar holds (a manifest's NaN or 1e20)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (ValueError, OverflowError, OSError):
        return "?"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: Any = None) -> None:
    out = sys.stdout if out is None else out   # looked up per call: a caller may have redirected it
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, r in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) if _numeric(c) else c.ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip(), file=out)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=out)


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text[0] == "-") and text.replace(".", "").replace(" ", "").rstrip(
        "KMGTiB%x").lstrip("-").isdigit()


def emit_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str, allow_nan=True)
    sys.stdout.write("\n")
