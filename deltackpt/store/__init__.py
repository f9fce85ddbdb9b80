"""Keys and bytes, nothing else.  Stores know no format, no manifest, no torch."""

from .base import Store
from .counting import CountingStore
from .local import LocalStore
from .memory import MemoryStore

__all__ = ["Store", "LocalStore", "MemoryStore", "CountingStore"]
