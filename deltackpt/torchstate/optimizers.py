"""Optimizers given where one or several are accepted (``save(..., optimizer=)``, a Checkpointer's
lazy snapshots), checked before anything is written.

Example::

    opts = optimizers_of([adam, sgd])     # [adam, sgd]; a non-optimizer raises UnsupportedLeafError
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedLeafError


def optimizers_of(optimizer: Any) -> list[Any]:
    """``optimizer`` as a list of optimizers (one, a list or tuple); anything without step hooks is
    refused with :class:`~deltackpt.errors.UnsupportedLeafError` before anything is written."""
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for opt in opts:
        if not all(hasattr(opt, a) for a in ("register_step_pre_hook", "register_step_post_hook", "param_groups", "state")):
            raise UnsupportedLeafError(f"optimizer: expected a torch.optim.Optimizer (or a list of them), "
                                       f"got {type(opt).__name__}")
    return opts
