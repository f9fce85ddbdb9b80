"""Keys and bytes, nothing else.  Stores know no format, no manifest, no torch.

What it may import: ``errors``, ``faults``, ``libc`` and ``deps`` (fsspec is optional); nothing
else of deltackpt (import-linter checks it).  A store may also lend a value's bytes in place
(``Store.map_value``: a local file in the page cache, read without a copy).
"""

from .base import Store
from .cache import CachedStore, ReadCache
from .counting import CountingStore
from .fsspec_store import FsspecStore
from .local import LocalStore
from .memory import MemoryStore

__all__ = ["Store", "LocalStore", "MemoryStore", "CountingStore", "FsspecStore", "ReadCache", "CachedStore"]
