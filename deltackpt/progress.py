"""Progress bars for long operations: shown on a terminal, silent otherwise (pipes, CI, --json)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

_MIN_BYTES = 64 << 20  # operations on less than this finish before a bar is worth drawing


def enabled() -> bool:
    return sys.stderr.isatty() and os.environ.get("DELTACKPT_PROGRESS", "1") != "0"


@contextmanager
def bar(description: str, total: int, *, unit_bytes: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """Yields ``update(done, total)`` or None when no bar should be drawn."""
    if not enabled() or (unit_bytes and total < _MIN_BYTES):
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [TextColumn("{task.description}"), BarColumn()]
    columns += [DownloadColumn()] if unit_bytes else [TextColumn("{task.completed}/{task.total}")]
    columns += [TimeRemainingColumn()]
    with Progress(*columns, transient=True, console=None) as p:
        task = p.add_task(description, total=total)
        yield lambda done, tot: p.update(task, completed=done, total=tot)
