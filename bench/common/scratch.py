"""Scratch folders for bench scripts: removed on return, on an error, on Ctrl-C and on SIGTERM, so
that an interrupted or killed-by-timeout run leaves nothing behind in the temp folder (leaked bench
folders once filled a CI machine's disk).  A child process's files go under its parent's scratch
folder, so that the parent removes them even where the child was SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator


def _exit_on_sigterm() -> None:
    """Turn SIGTERM (a CI timeout, ``kill``) into SystemExit, so ``finally`` blocks run; only where
    nobody installed a handler of their own, and only from the main thread (where Python allows it)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


@contextlib.contextmanager
def scratch(prefix: str, keep: str | None = None, parent: str | None = None) -> Iterator[str]:
    """A fresh temp folder (under ``parent``, else the system's temp folder), removed on exit however
    the block ends.  ``keep``: a folder the user named (``--dir``): created if missing, used as is,
    and left in place."""
    if keep:
        os.makedirs(keep, exist_ok=True)
        yield keep
        return
    _exit_on_sigterm()
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def compile_cache() -> Iterator[None]:
    """Point torch's compile cache at a scratch folder for the block, and remove it after.

    transformers' model classes touch that cache, whose default folder is
    ``<temp>/torchinductor_<user>``: created, and left behind, by any run that builds one.  The
    processes the block starts inherit the setting.  A folder the user set is left alone."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    with scratch("deltackpt-bench-inductor-") as path:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
        try:
            yield
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
