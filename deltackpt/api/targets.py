"""Does a saved state fit the live objects it is about to be written into?  :func:`deltackpt.restore`
and :func:`deltackpt.resume` ask before their first write, so a mismatch leaves the model and
optimizer exactly as they were (all or nothing) and is one :class:`StateMismatchError` naming the
version, the part and the tensor, instead of torch's ``ValueError``/``RuntimeError`` halfway.

What is checked is what ``load_state_dict`` itself would refuse: for a module, missing and
unexpected keys (``strict``), a value that is not a tensor where the module holds one, and shapes;
for a ``torch.optim.Optimizer``, the number of parameter groups and of parameters in each.

Example::

    check_model(model, state["model"], strict=True, where="version 3f2a9c01d2")
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import StateMismatchError


def _few(names: list[str]) -> str:
    return f"{names[:5]}{'...' if len(names) > 5 else ''}"


def check_model(model: Any, state: Any, *, strict: bool, where: str) -> None:
    """Refuse ``state`` if ``model.load_state_dict(state, strict=strict)`` would, before any write."""
    import torch
    from torch.nn.parameter import is_lazy

    if not isinstance(state, Mapping):
        raise StateMismatchError(f"{where}: its 'model' entry is a {type(state).__name__}, not a state dict; "
                                 "nothing was restored")
    mine = model.state_dict(keep_vars=True)
    if strict:
        missing = [k for k in mine if k not in state]
        unexpected = [k for k in state if k not in mine]
        if missing or unexpected:
            raise StateMismatchError(f"{where} does not match the model: missing {_few(missing)}, unexpected "
                                     f"{_few(unexpected)} (pass strict=False to skip them); nothing was restored")
    for k, dst in mine.items():
        if k not in state or not isinstance(dst, torch.Tensor) or is_lazy(dst):
            continue  # a lazy parameter takes any shape; a non-tensor entry (extra state) is the module's to judge
        src = state[k]
        if not isinstance(src, torch.Tensor):
            raise StateMismatchError(f"{where}, model tensor {k!r}: the version holds a {type(src).__name__}, "
                                     "the model a tensor; nothing was restored")
        if src.shape != dst.shape:
            raise StateMismatchError(f"{where}, model tensor {k!r}: saved {list(src.shape)}, the model has "
                                     f"{list(dst.shape)}; nothing was restored")


def check_optimizer(optimizer: Any, saved: Any, *, where: str) -> None:
    """Refuse ``saved`` if ``optimizer.load_state_dict(saved)`` would (its group structure), before
    any write.  ``saved`` may hold tensor references not read yet: only its plain layout is looked at."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or getattr(optimizer, "_optimizer_load_state_dict_pre_hooks", None):
        # not torch's layout (a wrapper of several optimizers saving {name: state_dict}), or hooks
        # that rewrite the state first: the optimizer decides
        return
    if not isinstance(saved, Mapping) or not isinstance(saved.get("param_groups"), list) \
            or not isinstance(saved.get("state"), Mapping):
        raise StateMismatchError(f"{where}: its 'optimizer' entry is not an optimizer state_dict "
                                 "(no 'state' and 'param_groups'); nothing was restored")
    saved_groups = saved["param_groups"]
    if len(saved_groups) != len(groups):
        raise StateMismatchError(f"{where}: the optimizer has {len(groups)} parameter group(s), the version "
                                 f"{len(saved_groups)}; nothing was restored")
    for n, (g, s) in enumerate(zip(groups, saved_groups)):
        params = s.get("params") if isinstance(s, Mapping) else None
        if not isinstance(params, list) or len(params) != len(g["params"]):
            have = len(params) if isinstance(params, list) else "no"
            raise StateMismatchError(f"{where}: optimizer parameter group {n} has {len(g['params'])} parameters, "
                                     f"the version's {have}; nothing was restored")
