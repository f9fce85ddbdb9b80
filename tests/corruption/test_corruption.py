"""Damage a real repository in >= 1000 deterministic ways and check verify, loads and the untouched
versions (issue 5, item 4).  DELTACKPT_RELIABILITY=full runs all cases; the default suite every 8th.

Expected consequences are computed from the pristine files, independently of verify:

- a pack: the versions whose chunks (through delta chains) have object bytes in the damaged
  range fail to load with CorruptObjectError; damage outside every object (magic, header,
  trailer) affects no load, but verify must still flag the pack (its bytes no longer hash to its
  name and rebuild_index could not read it);
- an index file: any damage invalidates the whole file (checksum), so the versions needing a
  chunk listed only in it fail with CorruptObjectError ("not in the index") until
  rebuild_index restores the entries from the packs (tests/corruption/test_rebuild.py);
- a manifest: that version (CorruptObjectError; UnknownVersionError when deleted);
- a ref: no version's data; resolving the ref fails with a typed error and verify names the
  ref file.  Every version still loads by id.

Two deletions cannot be detected by design and are not counted as verify misses: a deleted ref
file (indistinguishable from ``untag`` or a crash before the first ref moved) and a deleted
manifest that no ref names (indistinguishable from gc removing the version).  Their loads are
still checked.
"""

from __future__ import annotations

import os
import shutil

import pytest

import deltackpt
from deltackpt.errors import CorruptObjectError, DeltackptError, FormatVersionError, UnknownVersionError

from . import _cases
from ._model import Pristine, build, state_digest, survey

TALLY = {"cases": 0, "cases_with_affected_versions": 0, "flagged": 0, "undetectable_by_design": 0, "verify_false_negatives": 0,
         "missed_versions": 0, "over_named_versions": 0, "wrong_restores": 0, "untyped_errors": 0, "damage_not_reaching_data": 0}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Pristine:
    path = str(tmp_path_factory.mktemp("pristine") / "repo")
    build(path)
    p = survey(path)
    assert len(p.versions) == len(_build_steps()) and len(p.files["pack"]) >= 5
    return p


def _build_steps():
    from ._model import ENCODINGS
    return ENCODINGS


def _expected(p: Pristine, case: _cases.Case, key: str, rng) -> tuple[set[str], str | None]:
    """(versions that must fail to load, ref key that must fail to resolve)."""
    if case.category == "pack":
        entries = p.pack_entries[key]
        hit = {e.chunk_id for e in entries if rng is None or (e.offset < rng[1] and rng[0] < e.offset + e.length)}
        return p.users(hit), None
    if case.category == "index":
        others = set().union(*(c for k, c in p.index_chunks.items() if k != key))
        return p.users(p.index_chunks[key] - others), None
    if case.category == "manifest":
        return {key.rsplit("/", 1)[-1]}, None
    return set(), key


@pytest.mark.parametrize("case", _cases.selected_cases(), ids=lambda c: c.id)
def test_damage_is_flagged_and_contained(case, pristine, tmp_path):
    """verify flags the damage and names every affected version; affected versions raise typed
    errors on load, all others restore bit-identically."""
    root = str(tmp_path / "repo")
    shutil.copytree(pristine.path, root)
    keys = pristine.files[case.category]
    key = keys[case.file_no % len(keys)]
    rng = _cases.apply(case, root, key)
    affected, bad_ref = _expected(pristine, case, key, rng)
    TALLY["cases"] += 1
    TALLY["cases_with_affected_versions"] += bool(affected)

    _check_verify(case, pristine, root, key, affected, bad_ref)
    for vid in pristine.versions:
        if vid in affected:
            _check_affected_load(case, pristine, root, vid)
            continue
        got = state_digest(deltackpt.load(root, vid))
        if got != pristine.digests[vid]:
            TALLY["wrong_restores"] += 1
        assert got == pristine.digests[vid], f"{case.id}: unaffected version {vid[:10]} restored differently"
    if bad_ref:
        name = "latest" if bad_ref == "refs/latest" else bad_ref.rsplit("/", 1)[-1]
        with pytest.raises((CorruptObjectError, UnknownVersionError)):
            deltackpt.load(root, name)
    shutil.rmtree(root)


def _check_verify(case, pristine: Pristine, root: str, key: str, affected: set[str], bad_ref: str | None) -> None:
    """verify flags the damage (unless undetectable by design) and names every affected version."""
    undetectable = case.kind == "delete" and (case.category == "ref" or (
        case.category == "manifest" and key.rsplit("/", 1)[-1] not in pristine.refs.values()))
    report = deltackpt.Repo(root).verify()
    named = set(report.bad_versions)
    if undetectable:
        TALLY["undetectable_by_design"] += 1
    else:
        if report.ok:
            TALLY["verify_false_negatives"] += 1
        else:
            TALLY["flagged"] += 1
        missed = affected - named
        TALLY["missed_versions"] += len(missed)
        assert not report.ok, f"verify missed {case.id} on {key}"
        assert not missed, f"verify did not name {sorted(missed)} for {case.id}: {report.to_json()['errors']}"
        if bad_ref:
            assert any(p.object == bad_ref for p in report.errors), report.to_json()["errors"]

    real_named = named & set(pristine.versions)
    TALLY["over_named_versions"] += len(real_named - affected)


def _check_affected_load(case, pristine: Pristine, root: str, vid: str) -> None:
    """An affected version fails to load with the typed error its damage calls for (or, for a
    pack, restores intact when the damage missed every byte the decoder uses)."""
    want = UnknownVersionError if case.kind == "delete" and case.category == "manifest" else CorruptObjectError
    if case.category == "pack":
        # a flipped object version byte above 1 reads as "written by a newer deltackpt"
        want = (CorruptObjectError, FormatVersionError)
    try:
        state = deltackpt.load(root, vid)
    except want:
        return
    except DeltackptError as exc:
        TALLY["untyped_errors"] += 1
        raise AssertionError(f"{vid[:10]}: expected {want}, got {type(exc).__name__}: {exc}")
    if case.category == "pack" and state_digest(state) == pristine.digests[vid]:
        # the flipped bits are ones the decoder never uses (every link was re-hashed against
        # its id on the way): the data is intact, and verify has flagged the pack above
        TALLY["damage_not_reaching_data"] += 1
        return
    TALLY["wrong_restores"] += 1
    raise AssertionError(f"{case.id}: affected version {vid[:10]} loaded without an error")


def test_pristine_copy_verifies_clean(pristine, tmp_path):
    """An undamaged copy verifies ok with no bad version (no verify false positive)."""
    root = str(tmp_path / "repo")
    shutil.copytree(pristine.path, root)
    report = deltackpt.Repo(root).verify()
    assert report.ok and not report.bad_versions, report.to_json()


def test_zz_report_counts():
    """Print the tallies of this run (RELIABILITY.md figures come from the full run)."""
    print("\ncorruption tallies:", TALLY)
    assert TALLY["verify_false_negatives"] == 0 and TALLY["wrong_restores"] == 0
