"""The public API: ``save``, ``load``, ``restore``, ``gc`` and ``Repo`` (re-exported as
``deltackpt.save`` and so on).

What it may import: :mod:`deltackpt.snapshot` (background saves), :mod:`deltackpt.torchstate`
(state <-> leaves) and the torch-free core (``repo``, ``format``, ``store``).  Never
:mod:`deltackpt.training` or :mod:`deltackpt.integrations`: they are built on this package.
Inside it, ``repo`` (the Repo class) sits on ``saving`` and ``loading``, which sit on
``handles`` (:class:`~.handles.Handle`: the owner of everything work on a repository starts and
holds; a function given a path opens one for the call and closes it); import-linter holds that
order, so no circle can come back.  torch is imported only by the functions that move tensors.

``internal`` is the one declared internal API :mod:`deltackpt.training` and
:mod:`deltackpt.integrations` may use beyond the public names (import-linter forbids them
``deltackpt.repo`` and ``deltackpt.snapshot``).

Example::

    import deltackpt
    deltackpt.save(model, "ckpt", step=100)
    deltackpt.restore(model, "ckpt", "latest~1")
"""

from .handles import portable_location
from .loading import load, restore
from .repo import Repo, gc, open_repo
from .saving import save

__all__ = ["Repo", "gc", "load", "open_repo", "portable_location", "restore", "save"]
