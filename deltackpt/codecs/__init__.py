"""Transforms of byte buffers.  No store, no manifest, no torch: each codec is a pure function of
its inputs.  ``registry`` maps frozen encoding ids to codecs; ``pipeline`` picks one per chunk."""
