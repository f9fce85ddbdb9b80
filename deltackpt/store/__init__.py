"""Keys and bytes, nothing else.  Stores know no format, no manifest, no torch.

What it may import: ``errors``, ``faults`` and ``deps`` (fsspec is optional); nothing else of
deltackpt (import-linter checks it).
"""

from .base import Store
from .cache import CachedStore, ReadCache
from .counting import CountingStore
from .fsspec_store import FsspecStore
from .local import LocalStore
from .memory import MemoryStore

__all__ = ["Store", "LocalStore", "MemoryStore", "CountingStore", "FsspecStore", "ReadCache", "CachedStore"]
