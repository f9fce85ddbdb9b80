"""What a resumable training state holds: :func:`training_state` gathers each part's
``state_dict()`` and the RNG states; :class:`ResumableSampler` makes the data order one of them.

Example::

    sampler = ResumableSampler(len(dataset), seed=0)
    deltackpt.save(training_state(model=model, optimizer=opt, sampler=sampler, step=step), "ckpt", step=step)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from ..errors import StateMismatchError
from . import rng

if TYPE_CHECKING:
    from ..api.types import Stateful


class ResumableSampler(torch.utils.data.Sampler[int]):
    """A shuffling sampler whose position can be saved and restored.

    Each epoch is a permutation from ``torch.Generator().manual_seed(seed + epoch)`` (the global
    RNG is not touched).  ``state_dict()`` records the epoch and how many indices were handed out;
    after ``load_state_dict`` the next iteration continues from there.  With ``num_workers > 0`` the
    DataLoader prefetches ahead of training, so pass the count the loop actually consumed:
    ``sampler.state_dict(consumed=batches_done * batch_size)``.  Give the DataLoader its own
    ``generator``: otherwise every new iterator draws a seed from the global torch RNG, and the
    resumed run (which starts one more iterator) drifts from the original.

    Args:
        n: the dataset's length.
        seed: the seed of epoch 0's permutation (epoch e uses ``seed + e``).
        shuffle: False hands the indices out in order.

    Example:
        ```python
        sampler = ResumableSampler(len(ds), seed=0)
        loader = DataLoader(ds, batch_size=16, sampler=sampler, generator=torch.Generator())
        for epoch in range(sampler.epoch, 10):
            sampler.set_epoch(epoch)
            for batch in loader: ...
        ```
    """

    def __init__(self, n: int, *, seed: int = 0, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle = int(n), int(seed), shuffle
        self.epoch = 0
        self.consumed = 0
        self.reshuffled: list[list[int]] = []   # [position, seed] pairs applied to this epoch's order

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (a no-op when it is the current one, so a resumed position is kept)."""
        if epoch != self.epoch:
            self.epoch, self.consumed, self.reshuffled = int(epoch), 0, []

    def reshuffle(self, seed: int) -> None:
        """Hand out the rest of this epoch (the items not consumed yet) in a new order drawn from
        ``seed``; each item still comes once per epoch.  A divergence guard's ``data="reseed"``
        calls it after a rollback, so the batches that preceded a spike are not replayed as they
        were.  Saved with the position; the next epoch is drawn as usual."""
        self.reshuffled.append([self.consumed, int(seed)])

    def _order(self) -> list[int]:
        if not self.shuffle:
            order = list(range(self.n))
        else:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        for start, seed in self.reshuffled:
            rest = order[start:]
            perm = torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed)).tolist()
            order = order[:start] + [rest[i] for i in perm]
        return order

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        while self.consumed < self.n:
            i = order[self.consumed]
            self.consumed += 1
            yield i
        # the epoch is over: the next iteration starts the next one unless set_epoch says otherwise
        self.epoch, self.consumed, self.reshuffled = self.epoch + 1, 0, []

    def __len__(self) -> int:
        return self.n - self.consumed

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "seed": self.seed, "epoch": self.epoch,
                               "consumed": self.consumed if consumed is None else int(consumed)}
        if self.reshuffled:
            out["reshuffled"] = [list(p) for p in self.reshuffled]
        return out

    def check_state_dict(self, state: Mapping[str, Any]) -> None:
        """Raise :class:`StateMismatchError` if :meth:`load_state_dict` would refuse ``state``."""
        try:
            n, _, _, _ = (int(state[k]) for k in ("n", "seed", "epoch", "consumed"))
            for a, b in state.get("reshuffled", []):   # windows a divergence guard reshuffled
                int(a), int(b)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateMismatchError(f"sampler state is not what ResumableSampler.state_dict() writes: "
                                     f"{type(exc).__name__}: {exc}") from None
        if n != self.n:
            raise StateMismatchError(f"sampler was saved over {n} items, this one has {self.n}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.check_state_dict(state)
        self.seed, self.epoch, self.consumed = int(state["seed"]), int(state["epoch"]), int(state["consumed"])
        self.reshuffled = [[int(a), int(b)] for a, b in state.get("reshuffled", [])]


def training_state(*, model: "torch.nn.Module | None" = None, optimizer: "Stateful | None" = None,
                   scheduler: "Stateful | None" = None, scaler: "Stateful | None" = None,
                   sampler: "Stateful | None" = None, step: int | None = None, extra: object = None,
                   capture_rng: bool = True) -> dict[str, Any]:
    """The state :func:`~deltackpt.resume` restores: each given part's ``state_dict()``, the RNG
    states (Python, numpy, torch CPU and CUDA), the step and your ``extra``.

    Args:
        model: the module.
        optimizer: its optimizer.
        scheduler: a learning-rate scheduler.
        scaler: a ``GradScaler``.
        sampler: a :class:`ResumableSampler`.
        step: the training step.
        extra: plain values and tensors of your own (``resume(...).extra`` returns them).
        capture_rng: record the RNG states.

    Returns:
        ``{"model": ..., "optimizer": ..., ..., "rng": ..., "step": ..., "extra": ...}``, with the
        parts given.

    Example:
        ```python
        deltackpt.save(training_state(model=m, optimizer=opt, step=s), "ckpt", step=s)
        ```
    """
    out: dict[str, Any] = {}
    for name, part in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler),
                       ("scaler", scaler), ("sampler", sampler)):
        if part is not None:
            out[name] = part.state_dict()
    if capture_rng:
        out["rng"] = rng.capture()
    if step is not None:
        out["step"] = int(step)
    if extra is not None:
        out["extra"] = extra
    return out
