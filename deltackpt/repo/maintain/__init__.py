"""Maintenance: what keeps a repository healthy, and what tells about it.

``gc`` removes the versions outside the retention policy and the bytes only they held
(``gc_plan`` decides, and defines the ``GcReport``; gc then deltifies through ``..write``);
``retention`` is the policy of which versions to keep, ``holds`` the versions a live process keeps;
``verify`` re-reads and checks everything; ``rebuild`` derives the index from the packs; ``drill``
restores a version as a restarted process would and proves it; ``events`` writes and lists the
repository's event records.

What it may import: everything else of ``deltackpt.repo`` (``..write``, ``..read``, the floor),
``format``, ``codecs``, ``store`` and the top-level helpers.  Nothing of ``..write`` or ``..read``
imports it, so it is the top of the repository's layers.
"""
