"""Committing: a manifest, then ``latest`` by compare-and-swap, then the tag, under the refs
lock; and tag updates.  The last step of a save (spec/FORMAT.md §14); everything before it only
adds chunks nobody names yet."""

from __future__ import annotations

from dataclasses import replace

from ...errors import ConflictError, UnknownVersionError, UnsupportedLeafError
from ...format import refs
from ...format.ids import hex_id
from ...format.manifest import Manifest
from .. import locks
from ..layout import LATEST_REF, MANIFESTS, TAGS
from ..repository import Repository

#: how often a commit re-parents after losing the swap of ``latest`` before giving up
SWAP_RETRIES = 16


def writer_name() -> str:
    from ..._version import __version__
    return f"deltackpt {__version__}"


def commit(repo: Repository, manifest: Manifest, tag: str | None, *, move_latest: bool = True) -> tuple[str, int]:
    """Manifest, then ref; returns (version id, manifest bytes).  Racing writers are serialized by
    the refs lock and re-parented onto whatever ``latest`` is when they get it, so history stays
    linear and no save is lost.

    ``latest`` moves by compare-and-swap against the value read here: if it moved anyway (our
    lock was judged stale and broken, or the backend's locks are not atomic), the manifest is
    re-parented onto the new head and the swap retried, instead of overwriting that version.

    ``move_latest=False`` (an import): the manifest, with no parent, then the tag; ``latest`` and
    the history it heads are untouched (spec/FORMAT.md §12, "off the line")."""
    with locks.refs_lock(repo.store):
        if tag is not None and repo.store.exists(TAGS + tag):
            raise ConflictError(f"tag {tag!r} already names version {repo.read_ref(TAGS + tag)}; nothing was "
                                "committed (the chunks written are reused by the next save)")
        if not move_latest:
            manifest.parent = None
            data = manifest.to_bytes()
            vid = hex_id(data)
            repo.store.put_if_absent(MANIFESTS + vid, data, site="manifest")
            if tag is not None:
                repo.store.put_atomic(TAGS + tag, refs.encode_ref(vid), site="tag")
            return vid, len(data)
        for _attempt in range(SWAP_RETRIES):
            head = repo.read_ref_bytes(LATEST_REF)
            manifest.parent = None if head is None else refs.decode_ref(head, what=LATEST_REF)
            data = manifest.to_bytes()
            vid = hex_id(data)
            created = repo.store.put_if_absent(MANIFESTS + vid, data, site="manifest")
            if repo.store.swap(LATEST_REF, head, refs.encode_ref(vid), site="ref"):
                break
            if created:  # nothing names it: no orphan version left in the log
                repo.store.delete(MANIFESTS + vid, site="manifest.orphan")
        else:
            raise ConflictError(f"{repo.location}: 'latest' kept moving under the refs lock ({SWAP_RETRIES} tries); "
                                "nothing was committed (the chunks written are reused by the next save)")
        if tag is not None:
            repo.store.put_atomic(TAGS + tag, refs.encode_ref(vid), site="tag")
    return vid, len(data)


def set_tag(repo: Repository, name: str, vid: str, *, force: bool = False) -> None:
    refs.check_name(name)
    with locks.refs_lock(repo.store):
        # gc deletes manifests under this lock: a version resolved before it did must not be tagged
        if not repo.store.exists(MANIFESTS + vid):
            raise UnknownVersionError(f"version {vid} was removed (by gc) before tag {name!r} could name it; "
                                      "no tag was written")
        if force:
            repo.store.put_atomic(TAGS + name, refs.encode_ref(vid), site="tag")
        elif not repo.store.put_if_absent(TAGS + name, refs.encode_ref(vid), site="tag"):
            raise ConflictError(f"tag {name!r} already names version {repo.read_ref(TAGS + name)}; "
                                "delete it first or pass force=True")


def delete_tag(repo: Repository, name: str) -> None:
    refs.check_name(name)
    with locks.refs_lock(repo.store):
        if not repo.store.exists(TAGS + name):
            raise UnknownVersionError(f"no tag {name!r}")
        repo.store.delete(TAGS + name, site="tag.delete")


def check_storable(manifest: Manifest) -> None:
    """Refuse a manifest msgpack cannot encode (an integer beyond 64 bits, a str holding a lone
    surrogate) with :class:`UnsupportedLeafError` naming the field, so that a save fails before its
    first pack is written rather than after its packs and index.  The torch-facing caller names the exact key
    path; this is the guard for every other writer of the repository layer."""
    blank = Manifest(parent=None, time=0.0, tree=None, tensors=[], blobs=[])
    fields = ("step", "metrics", "meta", "tree", "tensors", "writer", "extra")
    try:   # all at once (one pass over the tree); field by field only to name a failure
        replace(blank, **{field: getattr(manifest, field) for field in fields}).to_bytes()
        return
    except (TypeError, ValueError, OverflowError):
        pass
    for field in fields:
        try:
            replace(blank, **{field: getattr(manifest, field)}).to_bytes()
        except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
            raise UnsupportedLeafError(f"the version's {field} cannot be stored (nothing was written): "
                                       f"{type(exc).__name__}: {exc!s:.200}") from None
