"""``deltackpt.save``: a training state in, a new version out (now, or in the background)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Literal, overload

from ..errors import DeltackptError, InvalidArgumentError, UnsupportedLeafError
from ..gcpause import collector_paused
from ..progress import bar
from ..repo.write import saver
from ..repo.versions import Version
from ..store.base import Store
from .handles import Handle

if TYPE_CHECKING:
    from ..snapshot.async_save import SaveHandle
    from ..repo.write.session import WriteSession
    from ..torchstate.flatten import TensorLeaf
    from .types import Encoding, Metrics, Optimizers, State, Where


@overload
def save(obj: State, repo: "str | os.PathLike[str] | Handle | Store", *, step: int | None = None,
         metrics: Metrics | None = None, meta: object = None, tag: str | None = None,
         encoding: Encoding | None = None, blocking: Literal[True] = True,
         workers: int | None = None, background: Where | None = None,
         optimizer: Optimizers | None = None, latest: bool = True) -> Version: ...


@overload
def save(obj: State, repo: "str | os.PathLike[str] | Handle | Store", *, step: int | None = None,
         metrics: Metrics | None = None, meta: object = None, tag: str | None = None,
         encoding: Encoding | None = None, blocking: Literal[False],
         workers: int | None = None, background: Where | None = None,
         optimizer: Optimizers | None = None, latest: bool = True) -> SaveHandle: ...


@overload
def save(obj: State, repo: "str | os.PathLike[str] | Handle | Store", *, step: int | None = None,
         metrics: Metrics | None = None, meta: object = None, tag: str | None = None,
         encoding: Encoding | None = None, blocking: bool,
         workers: int | None = None, background: Where | None = None,
         optimizer: Optimizers | None = None, latest: bool = True) -> "Version | SaveHandle": ...


def save(obj: State, repo: "str | os.PathLike[str] | Handle | Store", *, step: int | None = None,
         metrics: Metrics | None = None, meta: object = None, tag: str | None = None,
         encoding: Encoding | None = None, blocking: bool = True,
         workers: int | None = None, background: Where | None = None,
         optimizer: Optimizers | None = None, latest: bool = True) -> "Version | SaveHandle":
    """Save a module's state_dict, a state dict or a nested training state as a new version.

    Unchanged chunks are not written again; changed ones are stored as deltas against the
    previous version when that is smaller.  Everything that can refuse the input does so before
    the repository is created or touched.

    Who owns the work: saving to a :class:`~deltackpt.Repo` uses that handle (the bytes its next
    save deltas against, its save thread; ``repo.close()`` ends them).  Saving to a path opens a
    handle for this call, which a blocking save closes before returning and a background one frees
    once it is done: nothing of the save runs or writes into the folder afterwards.  A loop that
    saves often is better served by one ``Repo``: it keeps the bytes the next deltas need in
    memory instead of reading them back.  Type checkers see ``save(...)`` as a ``Version`` and
    ``save(..., blocking=False)`` as a ``SaveHandle``.


    Args:
        obj: a module (its ``state_dict()`` is saved), or any nesting of dicts, lists and tuples
            whose leaves are tensors and plain values (numbers, strings, booleans, None, bytes).
        repo: the repository: a path or URL (created on the first save), a :class:`~deltackpt.Repo`
            or a store.
        step: the training step to record (``log`` lists it, ``keep_every`` counts by it).
        metrics: numbers to record (``{"loss": 0.31}``); ``best:loss`` and ``keep_best`` choose by them.
        meta: plain values to record beside the state (hyperparameters, a git revision).
        tag: a name for the new version (kept by gc).
        encoding: lossy modes by name pattern, e.g. ``{"optimizer.*": "q8-delta"}``, or one mode for
            every float tensor; the default stores every tensor bit for bit.
        blocking: False returns a :class:`~deltackpt.snapshot.handle.SaveHandle` as soon as the
            tensors are copied to host memory; the rest runs in the background (``handle.wait()``
            returns the Version).  Any save first waits for a background save to the same
            repository still in flight, and raises its error if nobody has waited for it.
        workers: encoder threads.  By default a blocking save uses every core (up to 4) and a
            background save the cores the training loop leaves free (``os.cpu_count()`` minus
            ``torch.get_num_threads()``, at least 1).  A state under 6 MiB is encoded by the
            thread that writes it, without a pool (cheaper than starting one).  On Linux a
            background save's threads run under ``SCHED_IDLE`` until anyone waits for the save
            (:mod:`deltackpt.priority`; ``Repo(..., background=BackgroundOptions(idle=False))``
            turns it off).
        background: where a background save runs: ``"thread"``, or ``"process"`` (a persistent
            encoder process fed through shared memory, so the save's Python never takes the
            training loop's GIL; local repositories and CPU tensors only, others use the thread).
            Default: the handle's (``Repo(..., background=...)``), else ``"thread"``.
        optimizer: with ``blocking=False``, one optimizer or a list: a *lazy* snapshot.  The
            tensors the optimizer owns (its parameters and its state) are copied in the
            background while the next forward and backward run, and ``optimizer.step()`` waits for
            that copy before it writes; every other tensor is copied at call time.  Any other
            in-place write to those tensors before the next ``optimizer.step()``
            (``model.load_state_dict``, EMA weights swapped in) must call
            ``handle.wait_snapshot()`` first; :mod:`deltackpt.snapshot.lazy` lists what is safe
            without it.  With ``blocking=True`` it is checked, then ignored.
        latest: False commits the version off the training line (what ``deltackpt import`` does):
            ``latest`` does not move, so :func:`deltackpt.resume`, ``latest~N`` and the next
            save's parent ignore it, and gc ranks it after the training line; find it by ``tag``
            (give one: an untagged version off the line is the first gc removes) or by id.

    Returns:
        The new :class:`~deltackpt.Version` (its id, step, metrics, logical and written bytes),
        or, with ``blocking=False``, the :class:`~deltackpt.snapshot.handle.SaveHandle` whose
        ``wait()`` returns it.

    Raises:
        UnsupportedLeafError: a leaf that is neither a tensor nor plain data (it would need
            pickle), or a tensor of an unsupported kind; the message names its key.
        InvalidArgumentError: an argument out of its range (``latest``, ``encoding``, ``optimizer``).
        InvalidNameError: a tag name that is not allowed.
        ConflictError: the tag is taken.
        StoreError: the storage failed (a folder that cannot be created, a full disk); the
            message names the path and the reason.

    Example:
        ```python
        v = deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 100},
                           "ckpt", step=100, metrics={"loss": 0.31}, tag="warmup-done")
        h = deltackpt.save(model, "ckpt", step=200, blocking=False)   # training goes on
        h.wait()
        h = deltackpt.save(training_state(model=model, optimizer=opt), "ckpt", step=300,
                           blocking=False, optimizer=opt)        # returns before copying the weights
        ```
    """
    import torch

    from ..snapshot import async_save
    from ..snapshot.runtime import spare_cores
    from ..torchstate.flatten import flatten

    # the call's own objects (leaves, plan, manifest, index) die with it: the collector is paused
    # (gcpause.py); a background save's thread runs after the call without the pause
    with collector_paused():
        if isinstance(obj, torch.nn.Module):
            obj = obj.state_dict()
        tree, leaves = flatten(obj)
        # everything that can refuse the input does so before a repository is created or touched
        record = _checked_record(leaves, step, metrics, meta, tag, encoding, background, workers)
        if not isinstance(latest, bool):
            raise InvalidArgumentError(f"latest must be True or False, got {latest!r}")
        record["latest"] = latest
        optimizers = None
        if optimizer is not None:
            from ..torchstate.optimizers import optimizers_of
            optimizers = optimizers_of(optimizer)
        owned = not isinstance(repo, Handle)
        handle = repo if isinstance(repo, Handle) else Handle(repo, create=True)
        try:
            write = _writer(handle.session, encoding, record, workers)
            if not blocking:
                devices = [str(leaf.tensor.device) for leaf in leaves]
                threads = workers or spare_cores()
                result = async_save.submit(handle.runtime, leaves, tree,
                                           lambda staged, t, **where: write(staged, t, devices, threads, **where),
                                           where=background, optimizers=optimizers)
                if owned:   # opened for this save alone: it frees itself once the save is done
                    handle.runtime.release_when_idle(handle.release)
                    owned = False
                return result
            handle.wait()   # the background saves already made to this repository commit first
            return write(leaves, tree)
        finally:
            if owned:
                handle.close()


def _checked_record(leaves: list[TensorLeaf], step: object, metrics: Metrics | None, meta: object, tag: str | None,
                    encoding: Encoding | None, background: str | None, workers: object) -> dict[str, Any]:
    """What the manifest records besides the tensors (step, metrics, meta, tag), checked with
    every other argument of :func:`save`: a DeltackptError here means nothing was written."""
    from ..format.refs import check_name
    from ..torchstate.dtypes import name_of
    from ..torchstate.flatten import INT_MAX, INT_MIN, int_text, metrics_of, plain_only
    from ..torchstate.planner import plan_blobs

    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise UnsupportedLeafError(f"step must be an int, got {type(step).__name__}")
    if step is not None and not INT_MIN <= step <= INT_MAX:
        raise UnsupportedLeafError(f"step {int_text(step)} does not fit in 64 bits")
    plain_metrics, plain_meta = metrics_of(metrics), plain_only(meta, "meta")
    if background not in (None, "thread", "process"):
        raise DeltackptError(f"background must be 'thread' or 'process', got {background!r}")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise DeltackptError(f"workers must be a positive int (encoder threads), got {workers!r}")
    plan_blobs([], encoding)
    for leaf in leaves:
        name_of(leaf.tensor.dtype, leaf.name)
    if tag is not None:
        check_name(tag)
    return dict(step=step, metrics=plain_metrics, meta=plain_meta, tag=tag)


def _writer(session: WriteSession, encoding: Encoding | None, record: dict[str, Any],
            workers: int | None) -> Callable[..., Version]:
    """The function that writes one version of ``leaves`` through ``session``: called now by a
    blocking save, later (with the staged copies) by a background one, in a thread or the encoder
    process."""
    from ..torchstate.planner import plan_blobs

    def write(leaves: list[TensorLeaf], tree: Any, devices: list[str] | None = None, threads: int | None = workers,
              encoder: Any = None, segment: Any = None) -> Version:

        blobs, entries = plan_blobs(leaves, encoding)
        if devices is not None:  # staged copies, this save's own, on the CPU; record where the tensors lived
            for b in blobs:
                b.private = True
            for e, device in zip(entries, devices):
                e.device = device
        kwargs = dict(record, workers=threads)
        if encoder is not None:
            vid, stats = encoder.write_version(session, blobs, entries, tree, segment=segment, **kwargs)
        else:
            total = sum(len(b.data) for b in blobs)
            with bar("save", total if devices is None else 0) as update:
                vid, stats = saver.write_version(session, blobs, entries, tree, progress=update, **kwargs)
        return session.repo.version(vid, manifest=stats.manifest)

    return write
