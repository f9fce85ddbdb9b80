"""A writer's state on one repository: the settings its saves use, the delta bases kept between
saves (:class:`~..delta_cache.DeltaCache`) and what deltification found not worth doing.

A :class:`WriteSession` belongs to one handle (the public :class:`deltackpt.Repo`, or the encoder
child's own); nothing in it is shared between handles, and it starts no thread: deltification
after a save runs in the thread that saved, a bounded step at a time (``saver``), so when a save
returns nothing of it is still running.

Example::

    session = WriteSession(Repository("ckpt", create=True))
    vid, stats = saver.write_version(session, blobs, tensors, tree, step=10)
    session.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...codecs import scratch
from ...codecs.base import check_level
from ...format import config as config_fmt
from ...errors import InvalidArgumentError
from ..delta_cache import DeltaCache
from ..layout import DEFAULT_DELTA_CACHE_FRACTION, DEFAULT_DELTIFY_LAG
from ..repository import Repository
from .head import PAYBACK


@dataclass
class WriteSettings:
    """How a session's saves cut and encode chunks: from the repository's config unless the
    handle overrides them (``Repo(..., chunk_bytes=...)``), plus the zstd ``level``."""

    chunk_bytes: int
    keyframe_interval: int
    delta_base: str
    level: int = 1

    @property
    def reverse_deltas(self) -> bool:
        """Whether older versions are re-stored as reverse deltas (``delta_base = "child"``)."""
        return self.delta_base == "child" and self.keyframe_interval > 0


class WriteSession:
    """The writer's side of one repository handle (see the module docstring).

    ``delta_cache_bytes``: memory for the next save's delta bases (0: none; None: a tenth of the
    state last saved, ``DEFAULT_DELTA_CACHE_FRACTION``; a position without a cached base reads it
    from the repository when that pays).  ``deltify``: whether a save
    re-stores older versions as reverse deltas after it commits (a bounded step, inline).
    ``payback``: a rewrite is done only where the stored bytes it saves are at least this many
    times the bytes it writes (head.PAYBACK).
    """

    def __init__(self, repo: Repository, *, chunk_bytes: int | None = None, keyframe_interval: int | None = None,
                 delta_base: str | None = None, level: int | None = None,
                 delta_cache_bytes: int | None = None, deltify: bool = True,
                 payback: float = PAYBACK) -> None:
        cfg = repo.config
        config_fmt.check_overrides(chunk_bytes, keyframe_interval, delta_base, cfg.version)
        if level is not None:
            check_level(level)
        self.repo = repo
        self.settings = WriteSettings(
            chunk_bytes=cfg.chunk_bytes if chunk_bytes is None else chunk_bytes,
            keyframe_interval=cfg.keyframe_interval if keyframe_interval is None else keyframe_interval,
            delta_base=cfg.delta_base if delta_base is None else delta_base,
            level=1 if level is None else level)
        self.delta_cache = DeltaCache(delta_cache_bytes, DEFAULT_DELTA_CACHE_FRACTION)
        self.deltify = deltify
        self.payback = check_payback(payback)
        #: the newest versions deltification leaves as saved (a keep_last retention raises it)
        self.deltify_lag = DEFAULT_DELTIFY_LAG
        #: what deltification found not worth doing and the sizes it measured, so that later runs
        #: do not measure them again (deltify_memo.py)
        self.deltify_memo: Any = None
        #: the DeltifyReport (or the error) of the step the last save ran after it committed
        self.last_maintenance: Any = None

    @property
    def keep_whole_above(self) -> float:
        """A re-stored copy must be a delta at most this fraction of what it replaces."""
        return 1.0 / (1.0 + self.payback)

    @property
    def store(self) -> Any:
        return self.repo.store

    def close(self) -> None:
        """Forget the delta bases and deltification's memory, and free the closing thread's codec
        buffers (the handle is closing; deltification ran on the thread that saved, usually this one)."""
        self.delta_cache.clear()
        self.deltify_memo = None
        scratch.release()


def check_payback(value: object) -> float:
    """``payback`` as a float: stored bytes a rewrite must save per byte it writes (> 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise InvalidArgumentError(f"payback must be a positive number (stored bytes saved per byte written), "
                                   f"got {value!r:.60}")
    return float(value)
