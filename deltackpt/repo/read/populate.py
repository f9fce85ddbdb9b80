"""Faulting in fresh destination memory a range at a time, in one system call.

A load decodes into memory the process has never touched; the first write to each 4 KiB page
costs a page fault, and the kernel's zeroing of the page, one fault at a time (on the project
machine ~0.5 s of system time for 1.5 GB).  ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+) maps a
whole range in one call, about a third cheaper, and it runs on the worker that decodes into that
range next, so the cores share it.  Elsewhere (older kernels, other systems) it does nothing and
the decode faults the pages in as before.

Example::

    populate(memoryview(destination))   # before decoding into a fresh buffer
"""

from __future__ import annotations

import ctypes

from ... import libc

_PAGE = 4096
_MIN_BYTES = 64 << 10  # below this the faults cost less than the call


def populate(view: memoryview) -> None:
    """Fault in the whole pages inside the writable buffer ``view`` (a hint: never an error)."""
    if len(view) < _MIN_BYTES or view.readonly or not libc.knows(libc.MADV_POPULATE_WRITE):
        return
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    start = -(-addr // _PAGE) * _PAGE
    end = (addr + len(view)) // _PAGE * _PAGE
    if end > start:
        libc.madvise(start, end - start, libc.MADV_POPULATE_WRITE)   # a failure leaves the pages to fault as usual
