"""Background saves: a save that returns once the state is copied, and writes while training goes on.

``async_save`` runs ``deltackpt.save(..., blocking=False)``: a :class:`~.handle.SaveHandle`,
at most ``MAX_IN_FLIGHT`` saves in flight, a thread or an encoder process.  ``at_exit`` finishes
the saves in flight when the script ends (normal exit, an exception, Ctrl-C, SIGTERM).  ``staging`` makes the
host copy (pinned, shared-memory or plain buffers, reused between saves); ``lazy`` defers the
copy of an optimizer's tensors until its next ``step()``; ``prefault`` faults staging memory in
before the first save needs it.  Their threads run at idle CPU priority (:mod:`deltackpt.priority`).

What it may import: :mod:`deltackpt.torchstate` and the torch-free core.  It sits below the
public API (``deltackpt.save`` calls it), so it never imports :mod:`deltackpt.api`: it receives
the open Repository and a ``write`` function instead.
"""
