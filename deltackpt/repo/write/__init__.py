"""The write path: how chunks get into the store and take their final form.

``saver`` runs a save: ``chunking`` cuts blobs, ``encoder_pool`` says which threads encode them (a
pool, or the saving thread for a small state), ``chunk_encoder`` dedups each chunk against what is
stored (``presence``: only chunks whose packs still exist) and chooses its form (``head``: whole or
a small forward delta), ``packer`` streams the objects into packs and writes one index file, and
``commit`` names the manifest under the refs lock.  ``arena`` holds a save's private chunk copies,
``abandon`` stops saves in flight at exit, ``encoder_process`` runs saves in a child process for
background saves.  ``session`` is a writer's state on one repository (settings, the delta bases kept
between saves, deltification's memory), owned by the handle that saves.  After committing, a save
keeps the index files few (``consolidate``) and, in the same thread and within a bound, re-stores
older versions' keyframes as deltas (``deltify``: ``deltify_plan`` finds what it may re-store,
``deltify_memo`` is what it remembers between runs) and drops the packs that made redundant
(``supersede``): nothing of a save runs once it has returned.

What it may import: the repository's floor (``..repository``, ``..layout``, ``..locks``,
``..versions``, ``..delta_cache``), ``..read`` through the repository, ``format``, ``codecs``,
``store`` and the top-level helpers.  It must not import ``..maintain``: maintenance calls the
write path (gc deltifies), never the reverse.
"""
