"""Byte layouts of the repository format: no I/O, no torch.  See spec/FORMAT.md."""
