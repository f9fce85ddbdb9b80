"""What a thread keeps between chunks: its work buffers (:mod:`.buffers`) and its zstd contexts
(:mod:`.bytegroup`).  A pool thread's go with the thread; the thread that called a save keeps its
own after the call, because deltification runs in it (about 8 MiB of buffers and a few zstd
contexts), so the handle releases them on that thread when it closes.

Example::

    release()   # on the thread that saved: its buffers and contexts are freed
"""

from __future__ import annotations

from . import buffers, bytegroup


def release() -> None:
    """Free the calling thread's work buffers and zstd contexts (the next codec call on this
    thread allocates them again)."""
    buffers.release()
    bytegroup.release()
