"""The only package that imports torch: state <-> leaves, planning, and the public API."""
