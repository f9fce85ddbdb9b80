"""Where a blob is cut: whole rows of the leading dimension, about ``target`` bytes a chunk.

A row larger than the limit is cut at element boundaries instead, so a chunk never exceeds
``MAX_CHUNK_BYTES``.  Boundaries depend only on (nbytes, row_bytes, itemsize, target), so the same
tensor shape is always cut the same way and chunk i of one version lines up with chunk i of the next.
"""

from __future__ import annotations

from ...format.limits import MAX_CHUNK_BYTES


def chunk_bounds(nbytes: int, row_bytes: int, itemsize: int, target: int) -> list[tuple[int, int]]:
    if nbytes == 0:
        return []
    target = max(1, min(target, MAX_CHUNK_BYTES))
    unit = row_bytes if 0 < row_bytes <= target and nbytes % row_bytes == 0 else 0
    if not unit:
        unit = max(itemsize, 1)
        unit = max(unit, (target // unit) * unit)  # whole elements, close to target
        step = unit
    else:
        step = max(1, target // unit) * unit
    return [(s, min(s + step, nbytes)) for s in range(0, nbytes, step)]
