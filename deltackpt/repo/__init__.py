"""Repository semantics, torch-free: open/init, saving chunks, choosing which copy of a chunk to
read, revisions, locks, gc, verify, retention.

What it may import: ``format``, ``codecs``, ``store`` and the top-level ``errors``/``faults``/
``progress``/``deps``; never torch, nor any package above it (``torchstate`` and up).
"""
