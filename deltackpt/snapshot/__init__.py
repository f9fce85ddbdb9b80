"""Background saves: a save that returns once the state is copied, and writes while training goes on.

``runtime`` is the owner: a :class:`~.runtime.SaveRuntime` per repository handle holds everything
its background saves start and keep (the save thread, started when there is work and gone when
there is none; the staging memory; lazy copies; pre-fault threads; the encoder process), set up by
a :class:`~.runtime.BackgroundOptions`, and ``close()`` ends all of it.  ``async_save`` runs
``deltackpt.save(..., blocking=False)`` on it: a :class:`~.handle.SaveHandle`, at most
``max_in_flight`` saves in flight, a thread or an encoder process.  ``at_exit`` holds the one
process-wide record, for what belongs to the process: it finishes the saves in flight when the
script ends (normal exit, an exception, Ctrl-C, SIGTERM) and lets a save wait for earlier ones to
the same repository.  ``staging`` makes the host copy (pinned, shared-memory or plain buffers,
reused between saves; ``pinned_slabs`` carves a CUDA state's pinned buffers out of power-of-two
slabs, so torch's pinned allocator rounds nothing up; ``host_copy`` makes the copy, across the
cores torch leaves free); ``lazy`` defers the copy of an optimizer's tensors until its next
``step()``; ``prefault`` faults staging memory in before the first save needs it.  Their threads
run at idle CPU priority (:mod:`deltackpt.priority`).

What it may import: :mod:`deltackpt.torchstate` and the torch-free core.  It sits below the
public API (``deltackpt.save`` calls it), so it never imports :mod:`deltackpt.api`: it receives
the handle's write session and a ``write`` function instead.
"""
