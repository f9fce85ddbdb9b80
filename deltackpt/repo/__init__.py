"""Repository semantics, torch-free, in three parts over one shared floor.

* ``write/``: how chunks get into the store and take their final form.  A save (``saver``: chunk,
  dedup, encode, pack, index, commit), the writer's state on a repository (``session``), the
  encoder child process of background saves, and what a save does after it commits, in its own
  thread and within a bound: deltification (``deltify``, ``supersede``) and keeping the index
  files few (``consolidate``).
* ``read/``: how bytes come back out: the index in memory, which stored copy of a chunk to read, a
  delta chain walked to its keyframe and checked link by link, live rollback, pack files read in
  bounded pieces.
* ``maintain/``: what keeps a repository healthy and tells about it: gc (plan, then crash-safe
  deletes), retention and holds, verify, rebuilding the index, rollback drills, event records.

The floor, here at the top level: ``repository`` (the open repository: config, refs, manifests,
revisions, composed with ``read/``'s ``Index`` and ``ChunkReader``; it holds no writer state), and what every part shares and
that imports no part: ``layout`` (keys), ``locks`` (over ``lock_holders``, which judges whether a
lock's holder process lives), ``versions`` (what ``log`` reports), ``delta_cache`` (the bases of
the next deltas, which the repository handle keeps between saves).

The layers (import-linter checks them): ``maintain -> write -> repository -> read -> (layout |
locks | versions | delta_cache) -> lock_holders``; each part keeps its own modules in layers too,
so no import circle forms anywhere.  Maintenance calls the write path (gc deltifies at its end), never the
reverse; a save and a read know nothing of gc.

What it may import: ``format``, ``codecs``, ``store`` and the top-level ``errors``/``faults``/
``progress``/``deps``/``priority``/``threads``; never torch, nor any package above it
(``torchstate`` and up).
"""
