"""Every part :func:`deltackpt.resume` restores, checked against the version before the first one
is written: the model, the optimizer (:mod:`deltackpt.api.targets`), the scheduler, the GradScaler,
the sampler and the RNG states.  A part the version lacks, or holds in a shape its live object
would refuse, is one :class:`StateMismatchError` naming the part, and nothing is applied.

Example::

    check_parts(state, "version 3f2a9c01d2", {"model": model, "optimizer": opt}, strict=True, rng_too=True)
"""

from __future__ import annotations

from typing import Any, Mapping

from ..api.targets import check_model, check_optimizer
from ..errors import StateMismatchError
from . import rng
from .state import ResumableSampler

#: what GradScaler.load_state_dict reads from an enabled scaler's state
_SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def check_parts(state: Any, where: str, parts: Mapping[str, Any], *, strict: bool, rng_too: bool) -> None:
    """Raise before anything is written if any given part cannot take the version's entry."""
    if not isinstance(state, dict):
        raise StateMismatchError(f"{where} is not a training state (a dict); use deltackpt.load")
    absent = [name for name, target in parts.items() if target is not None and name not in state]
    if absent:
        raise StateMismatchError(f"{where} holds no {', '.join(repr(a) for a in absent)} "
                                 f"entr{'y' if len(absent) == 1 else 'ies'} to restore; nothing was restored")
    for name, target in parts.items():
        if target is None:
            continue
        saved = state[name]
        if name == "model":
            check_model(target, saved, strict=strict, where=where)
        elif name == "optimizer":
            check_optimizer(target, saved, where=where)
        elif not isinstance(saved, Mapping):
            raise StateMismatchError(f"{where}: its {name!r} entry is a {type(saved).__name__}, not a state dict; "
                                     "nothing was restored")
        elif name == "scaler":
            _check_scaler(target, saved, where)
        elif name == "sampler" and isinstance(target, ResumableSampler):
            try:
                target.check_state_dict(saved)
            except StateMismatchError as exc:
                raise StateMismatchError(f"{where}: {exc}; nothing was restored") from None
    if rng_too and "rng" in state:
        try:
            rng.check(state["rng"])
        except StateMismatchError as exc:
            raise StateMismatchError(f"{where}: {exc}; nothing was restored") from None


def _check_scaler(scaler: Any, saved: Mapping[str, Any], where: str) -> None:
    enabled = getattr(scaler, "is_enabled", lambda: False)()
    if not enabled:
        return  # a disabled scaler ignores what it is given
    if not saved:
        raise StateMismatchError(f"{where}: its 'scaler' entry is empty (saved from a disabled GradScaler), this "
                                 "scaler is enabled; nothing was restored")
    missing = [k for k in _SCALER_KEYS if k not in saved]
    if missing:
        raise StateMismatchError(f"{where}: its 'scaler' entry lacks {missing}; nothing was restored")
