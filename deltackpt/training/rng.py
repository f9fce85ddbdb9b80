"""Random number generator states as plain values and tensors, so they save without pickle.

``capture()`` returns a dict holding Python's ``random``, numpy's global generator, torch's CPU
generator and (when CUDA is initialised) every CUDA device's generator; ``restore(state)`` puts
them back.  numpy's state tuple becomes ``{"kind", "keys" (a uint32 tensor), "pos", "has_gauss",
"cached_gaussian"}``; Python's becomes ``{"version", "internal" (an int64 tensor), "gauss_next"}``.
Generators you create yourself (``np.random.default_rng``, ``torch.Generator``) are yours to
save: ``torch.Generator.get_state()`` is a uint8 tensor, and a numpy ``Generator``'s
``bit_generator.state`` is a dict of ints.

Example::

    state = {"model": model.state_dict(), "rng": deltackpt.training.rng.capture()}
    deltackpt.save(state, "ckpt", step=step)
    ...
    deltackpt.training.rng.restore(deltackpt.load("ckpt")["rng"])
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ..errors import StateMismatchError


def capture() -> dict[str, Any]:
    """The current state of every global generator (copies; later draws do not change it)."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.array(keys, dtype=np.uint32)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return out


def check(state: Any) -> None:
    """Raise :class:`StateMismatchError` if :func:`restore` would refuse ``state``; sets nothing."""
    _parsed(state)


def _parsed(state: Any) -> tuple[tuple[int, tuple[int, ...], Any], tuple[str, np.ndarray, int, int, float], torch.Tensor,
                                 Any]:
    """(python, numpy, torch CPU, CUDA) generator states, each checked."""
    try:
        py, npy = state["python"], state["numpy"]
        internal = tuple(int(x) for x in py["internal"].tolist())
        python = (int(py["version"]), internal, py["gauss_next"])
        keys = npy["keys"].numpy().astype(np.uint32)
        numpy_state = (str(npy["kind"]), keys, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"]))
        cpu = state["torch"].to(torch.uint8).cpu()
        cuda = state.get("cuda")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateMismatchError(f"rng state is not what deltackpt.training.rng.capture() writes: {exc}") from None
    # the sizes the setters check, checked before the first of them runs
    sizes = {"python": (len(internal), len(random.getstate()[1])), "numpy": (keys.size, 624),
             "torch": (cpu.numel(), torch.get_rng_state().numel())}
    wrong = [f"{k} holds {got} values, not {want}" for k, (got, want) in sizes.items() if got != want]
    if wrong or numpy_state[0] != "MT19937":
        raise StateMismatchError(f"rng state is not what deltackpt.training.rng.capture() writes: "
                                 f"{'; '.join(wrong) or 'numpy kind ' + repr(numpy_state[0])}")
    if cuda and torch.cuda.is_available():
        n = torch.cuda.device_count()
        if len(cuda) != n:
            raise StateMismatchError(f"rng state holds {len(cuda)} CUDA generators, this process sees {n} devices")
    return python, numpy_state, cpu, cuda


def restore(state: dict[str, Any]) -> None:
    """Put back what :func:`capture` returned (as loaded from a repository); a state it did not
    write is refused before any generator is set."""
    python, numpy_state, cpu, cuda = _parsed(state)
    try:
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(cpu)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise StateMismatchError(f"rng state is not what deltackpt.training.rng.capture() writes: {exc}") from None
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.to(torch.uint8).cpu() for s in cuda])
