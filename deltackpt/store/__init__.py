"""Keys and bytes, nothing else.  Stores know no format, no manifest, no torch.

What it may import: ``errors``, ``faults``, ``libc``, ``deps`` (fsspec is optional) and
``lazy_names``; nothing else of deltackpt (import-linter checks it).  A store may also lend a
value's bytes in place (``Store.map_value``: a local file in the page cache, read without a copy).

Each backend is imported at first use of its name: a restart from a local folder imports neither
the fsspec backend nor the memory, counting and caching stores (bench/RESTART.md, stop 49).

Example::

    from deltackpt.store import LocalStore
    store = LocalStore("ckpt")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_names import first_use_importer

if TYPE_CHECKING:   # what __getattr__ returns, for type checkers (never imported here at run time)
    from .base import Store as Store
    from .cache import CachedStore as CachedStore, ReadCache as ReadCache
    from .counting import CountingStore as CountingStore
    from .fsspec_store import FsspecStore as FsspecStore
    from .local import LocalStore as LocalStore
    from .memory import MemoryStore as MemoryStore

_LAZY = {"Store": "base", "LocalStore": "local", "MemoryStore": "memory", "CountingStore": "counting",
         "FsspecStore": "fsspec_store", "ReadCache": "cache", "CachedStore": "cache"}

if not TYPE_CHECKING:   # hidden from type checkers, so that a misspelt name is an error there
    __getattr__ = first_use_importer(__name__, _LAZY)

__all__ = ["Store", "LocalStore", "MemoryStore", "CountingStore", "FsspecStore", "ReadCache", "CachedStore"]
