"""The read path: how bytes come back out of a repository.

``index_state`` is the index in memory (a mixin of the repository) and ``copies`` chooses which
stored copy of a chunk to read (``PackGone``: that copy's pack is missing, try another);
``reader`` fetches objects, walks delta chains to their keyframe and checks every link (a mixin of
the repository too); ``live`` turns the chunk a destination already holds into the one asked for;
``packfile`` reads a whole pack file in bounded pieces (for verify and rebuild).

What it may import: ``..layout``, ``format``, ``codecs``, ``store`` and the top-level helpers.  It
must not import ``..repository`` (which is built on it), ``..write`` or ``..maintain``: reading
never writes, and ``live`` reaches the reader only through the ``ObjectSource`` it is handed.
"""
