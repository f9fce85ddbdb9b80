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

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_names import first_use_importer

if TYPE_CHECKING:   # what __getattr__ returns, for type checkers (never imported here at run time)
    from .handles import portable_location as portable_location
    from .loading import load as load, restore as restore
    from .repo import Repo as Repo, gc as gc, open_repo as open_repo
    from .saving import save as save

# Each name is imported from its own module at first use, so a process that only loads never
# imports the write path and maintenance behind Repo and save (bench/RESTART.md, "A restart's
# first load").
_LAZY = {"portable_location": "handles", "load": "loading", "restore": "loading", "Repo": "repo", "gc": "repo",
         "open_repo": "repo", "save": "saving"}

if not TYPE_CHECKING:   # hidden from type checkers, so that a misspelt name is an error there
    __getattr__ = first_use_importer(__name__, _LAZY)

__all__ = ["Repo", "gc", "load", "open_repo", "portable_location", "restore", "save"]
