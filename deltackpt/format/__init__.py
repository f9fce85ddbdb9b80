"""Byte layouts of the repository format: no I/O, no torch.  See spec/FORMAT.md.

What it may import: ``errors`` and its own modules; ``codecs`` and ``store`` sit beside it, every
other package above it.
"""
