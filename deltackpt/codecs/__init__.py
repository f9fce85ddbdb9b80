"""Transforms of byte buffers.  No store, no manifest, no torch: each codec is a pure function of
its inputs.  ``registry`` maps frozen encoding ids to codecs; ``pipeline`` picks one per chunk.

What it may import: numpy, zstandard, ``errors`` and its own modules; never ``store``,
``format.manifest``, ``repo`` or torch (import-linter checks it).
"""
