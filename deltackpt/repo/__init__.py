"""Repository semantics, torch-free: open/init, saving chunks, revisions, gc, verify."""
