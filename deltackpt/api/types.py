"""The types deltackpt's public signatures are made of: what a type checker (and a reader of the
signatures) needs beyond torch's and Python's own.

Where a signature still says ``Any`` it is a value whose structure the caller chose: the nested
state passed to :func:`deltackpt.save` (each leaf is checked when saving, not statically: a type
checker infers a dict literal such as ``{"model": sd, "step": 3}`` as ``dict[str, object]``, which a
precise recursive type would refuse), what :func:`deltackpt.load` returns (that same structure) and
the plain ``meta`` / ``extra`` values stored with a version.

Example::

    from deltackpt.api.types import Metrics

    def report(ckpt: deltackpt.Checkpointer, step: int, metrics: Metrics) -> None:
        ckpt.step(state_fn, step=step, metrics=metrics)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Mapping, Protocol, Sequence, TypeAlias, TypedDict, Union

if TYPE_CHECKING:
    import torch

    from ..repo.versions import Version


class SupportsItem(Protocol):
    """A 0-d tensor or a numpy scalar: a metric given as one is read with ``.item()``."""

    def item(self) -> float: ...


#: one reported value: a number, or a 0-d tensor / numpy scalar (read with ``.item()``)
MetricValue: TypeAlias = Union[float, SupportsItem]

#: the values a training loop reports at a step (``{"loss": loss, "lr": 3e-4}``)
Metrics: TypeAlias = Mapping[str, MetricValue]


class Stateful(Protocol):
    """A part of a training state: anything with ``state_dict()`` and ``load_state_dict(state)``
    (an optimizer or a wrapper of several, an LR scheduler, a GradScaler, a sampler)."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> object: ...


#: what :func:`deltackpt.save` takes: a module (its ``state_dict()`` is saved) or a nested state of
#: dicts (str or int keys), lists and tuples holding tensors and plain values (None, bool, int,
#: float, str, bytes); unsupported leaves are refused when saving (UnsupportedLeafError)
State: TypeAlias = Union["torch.nn.Module", "torch.Tensor", Mapping[str, Any], Mapping[int, Any], "list[Any]",
                         "tuple[Any, ...]"]

#: one optimizer or several (``save(..., optimizer=)``, a Checkpointer's lazy snapshots)
Optimizers: TypeAlias = Union["torch.optim.Optimizer", Sequence["torch.optim.Optimizer"]]

#: a version: a revision string (an id or prefix, a tag, ``latest~2``, ``best:loss``) or a Version
Revision: TypeAlias = Union[str, "Version"]

#: how tensors are encoded: one mode for all (``"lossless"``, ``"q8-delta"``, ...) or name pattern -> mode
Encoding: TypeAlias = Union[Mapping[str, str], str]

#: where a background save runs
Where: TypeAlias = Literal["thread", "process"]

#: a repository's delta topology (``Repo(..., delta_base=)``; bench/DELTAS.md compares them)
DeltaBase: TypeAlias = Literal["child", "parent", "keyframe"]


# reports ------------------------------------------------------------------------------------

class RepoInfo(TypedDict):
    """:meth:`deltackpt.Repo.info`: the repository's location and the settings its config holds."""

    location: str
    format_version: int
    repo_id: str
    chunk_bytes: int
    keyframe_interval: int
    delta_base: str


class VersionUsage(TypedDict):
    """One version's row of :meth:`deltackpt.Repo.du` (bytes)."""

    id: str
    short_id: str
    step: int | None
    logical_bytes: int
    written_bytes: int | None
    referenced_bytes: int
    unique_bytes: int


class UsageTotal(TypedDict):
    """The repository's totals in :meth:`deltackpt.Repo.du` (bytes)."""

    versions: int
    logical_bytes: int
    stored_bytes: int
    pack_bytes: int
    metadata_bytes: int


class Usage(TypedDict):
    """:meth:`deltackpt.Repo.du`: bytes per version and in total."""

    versions: list[VersionUsage]
    total: UsageTotal


class TensorDetail(TypedDict):
    """One tensor of :meth:`deltackpt.Repo.show`."""

    name: str
    dtype: str
    shape: list[int]
    logical_bytes: int
    stored_bytes: int
    chunks: int
    encoding: str
    exact: bool
    max_abs_err: float
    shared_blob: bool


class VersionDetail(TypedDict):
    """:meth:`deltackpt.Repo.show`: a version (``Version.to_json()``), its tensors, what its save
    wrote and its last rollback drill (an event's ``to_json()``, or None)."""

    version: dict[str, Any]
    exact: bool
    tensors: list[TensorDetail]
    written: dict[str, Any]
    last_drill: dict[str, Any] | None
