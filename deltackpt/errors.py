"""The deltackpt error tree.

Every error raised on purpose is a :class:`DeltackptError`.  Each subclass also inherits the
builtin exception a caller would naturally catch (``KeyError`` for an unknown version, ``ValueError``
for corrupt data, ...), so ``except KeyError`` keeps working for code that does not know us.
"""

from __future__ import annotations


class DeltackptError(Exception):
    """Root of every error deltackpt raises on purpose."""


class UnknownVersionError(DeltackptError, KeyError):
    """A revision (id, prefix, tag, ``latest~N``) names no version in the repository."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else "unknown version"


class AmbiguousVersionError(UnknownVersionError):
    """A version id prefix matches more than one version."""


class CorruptObjectError(DeltackptError, ValueError):
    """Stored bytes fail a check: hash, bounds, magic, checksum or schema."""


class FormatVersionError(DeltackptError, ValueError):
    """The repository (or an object) was written by a format version this reader does not know."""


class NotARepositoryError(DeltackptError, FileNotFoundError):
    """The path holds no deltackpt repository."""


class UnsupportedLeafError(DeltackptError, TypeError):
    """A value in the saved state can be neither a tensor leaf nor a plain msgpack leaf."""


class InvalidNameError(DeltackptError, ValueError):
    """A ref or tag name breaks the naming rules (path separators, dots, length, ...)."""


class RepositoryLockedError(DeltackptError, RuntimeError):
    """Another process holds a lock that this operation needs."""


class ConflictError(DeltackptError, RuntimeError):
    """A concurrent update won a race this operation had to lose (for example a tag that already exists)."""


class StoreError(DeltackptError, OSError):
    """The storage backend failed (disk full, I/O error, missing object)."""

    def __str__(self) -> str:
        # StoreError(errno, message): the message says the reason in words, the number is .errno
        # (OSError would print "[Errno 13] ..." in front of it)
        return str(self.strerror) if len(self.args) == 2 and self.strerror else super().__str__()


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """A key the repository refers to is missing from the store."""


class LimitExceededError(CorruptObjectError):
    """A size or count read from storage exceeds a documented limit."""


class OutOfMemoryError(DeltackptError, MemoryError):
    """A tensor (or blob) the version declares is too large to allocate in this process."""


class StateMismatchError(DeltackptError, ValueError):
    """A restore target (model or optimizer) does not match the saved state (missing keys, shapes)."""


class InvalidArgumentError(DeltackptError, ValueError, TypeError):
    """An argument to a public call has the wrong type or a value out of its range (a retention rule
    of NaN seconds, a count given as a str); refused before any lock is taken or byte written."""


class FileAccessError(DeltackptError, OSError):
    """A file the caller named (an import's input, a restore's output) cannot be read or written
    there: missing, a folder, not a regular file, no permission, no room."""


class ForeignFileError(DeltackptError, ValueError):
    """A file given to import is not a valid .pt (weights only) or .safetensors file."""


class CodecError(DeltackptError, ValueError):
    """A codec was asked to do something it cannot (unknown id, wrong parameters)."""


class MissingDependencyError(DeltackptError, ImportError):
    """An optional package a feature needs is not installed; the message says what to pip install."""


class DivergenceError(DeltackptError, RuntimeError):
    """Training kept diverging: a divergence guard rolled back as often as it may within its window,
    or found no version older than the bad stretch to roll back to."""


class SaveAbandonedError(DeltackptError, RuntimeError):
    """A save stopped before its commit because the process is exiting and was told not to wait
    (a second Ctrl-C while background saves finish); nothing of it is visible in the repository."""


class CheckpointNotFoundError(UnknownVersionError, FileNotFoundError):
    """A checkpoint path names neither a pointer file nor a revision (Lightning's contract is FileNotFoundError)."""


__all__ = [name for name in dir() if name.endswith("Error")]
