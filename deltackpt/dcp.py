"""``deltackpt.dcp.Writer`` / ``Reader``: torch.distributed.checkpoint storage on a deltackpt
repository (implemented in :mod:`deltackpt.integrations.dcp`).

Example::

    import torch.distributed.checkpoint as dcp
    import deltackpt.dcp

    dcp.save(state, storage_writer=deltackpt.dcp.Writer("s3://bucket/run1", step=100))
    dcp.load(state, storage_reader=deltackpt.dcp.Reader("s3://bucket/run1"))
"""

from .integrations.dcp import Reader, Writer

__all__ = ["Writer", "Reader"]
