"""Names checked by regexes anchored with '$', which also matches before a final newline (issue 16,
item 11): an index naming pack '<hex>\\n' raised a bare ValueError in every command (verify and
rebuild-index included), and 'v1\\n' was written to refs/tags as a valid tag.  Every check is a
fullmatch now."""

from __future__ import annotations

import os
import shutil

import pytest

import deltackpt
from deltackpt.errors import CorruptObjectError, InvalidNameError, StoreError, UnknownVersionError
from deltackpt.format import index as index_fmt
from deltackpt.format import refs
from deltackpt.format.ids import from_hex, hex_id, is_hex_prefix
from deltackpt.repo.read.packfile import read_entries
from deltackpt.repo.repository import Repository
from deltackpt.store.base import check_key

from ._hostile import make_repo, probe, root  # noqa: F401  (root: a fixture)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return make_repo(str(tmp_path_factory.mktemp("anchors") / "repo"))



def _tag_files(root: str) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "refs", "tags"))) if os.path.isdir(os.path.join(root, "refs", "tags")) else []


@pytest.mark.parametrize("text", ["a" * 31 + "\n", "0123456789abcdef0123456789abcde\n"])
def test_hex_ids_with_a_final_newline_are_refused(text):
    """from_hex and is_hex_prefix refuse 31 hex digits and a newline (fromhex raised ValueError on it)."""
    with pytest.raises(CorruptObjectError, match="hex id"):
        from_hex(text)
    assert not is_hex_prefix(text) and not is_hex_prefix("abcd\n")


def test_index_naming_a_pack_with_a_final_newline(root):
    """An index file naming pack '<31 hex>\\n' is skipped as damaged, named by verify (in-process and
    by the CLI), and rebuild-index replaces it; no command raises an untyped error."""
    repo = Repository(root)
    pid, (plen, entries) = next(iter(index_fmt.decode(open(os.path.join(root, repo.store.list("index/")[0]),
                                                           "rb").read()).items()))
    bad = index_fmt.encode({pid[:31] + "\n": (plen, entries)})
    key = "index/" + hex_id(bad)
    with open(os.path.join(root, key), "wb") as f:
        f.write(bad)
    repo = Repository(root)
    assert key in repo.index.bad_files and "hex id" in repo.index.bad_files[key]
    report = deltackpt.Repo(root).verify()
    assert not report.ok and any(p.object == key for p in report.errors)
    rep = probe("cli", root, "verify")
    assert rep["rc"] == 1 and key in rep["output"], rep
    assert deltackpt.load(root)["step"] == 1
    rep = probe("cli", root, "rebuild-index")
    assert rep["rc"] == 0, rep
    assert deltackpt.Repo(root).verify().ok


@pytest.mark.parametrize("name", ["v1\n", "v1\r\n", "latest\n", "abcd\n"])
def test_tag_with_a_final_newline_is_refused_and_writes_nothing(root, name):
    """tag('v1\\n') and save(tag='v1\\n') raise InvalidNameError and write nothing under refs/tags."""
    before = _tag_files(root)
    with pytest.raises(InvalidNameError):
        deltackpt.Repo(root).tag(name)
    with pytest.raises(InvalidNameError):
        deltackpt.save({"w": deltackpt.load(root)["w"]}, root, tag=name)
    assert _tag_files(root) == before


def test_tag_file_with_a_final_newline_in_its_name_is_not_a_tag(root):
    """A file refs/tags/'v1\\n' (left by an older writer) is not a tag: tags() omits it, 'v1' does not
    resolve through it, and verify names it."""
    vid = deltackpt.Repo(root).log()[0].id
    os.makedirs(os.path.join(root, "refs", "tags"), exist_ok=True)
    with open(os.path.join(root, "refs", "tags", "v1\n"), "w") as f:
        f.write(vid + "\n")
    repo = deltackpt.Repo(root)
    assert repo.tags() == {}
    with pytest.raises(UnknownVersionError):
        repo.resolve("v1")
    assert any(p.object == "refs/tags/v1\n" for p in repo.verify().errors)


def test_store_keys_and_revisions_are_fully_matched():
    """check_key refuses a key ending in a newline; a revision's ~N takes ASCII digits only."""
    with pytest.raises(StoreError):
        check_key("packs/ab/" + "a" * 32 + "\n")
    with pytest.raises(StoreError):
        check_key("config\n")
    assert refs.parse_revision("latest~12").back == 12
    with pytest.raises(UnknownVersionError):
        refs.parse_revision("latest~\u0663")  # ARABIC-INDIC DIGIT THREE


def test_pack_file_named_with_a_final_newline_is_skipped_by_rebuild(root):
    """A pack file whose name ends in a newline is not where any pack belongs: rebuild-index skips it
    (reading it as pack '<hex>\\n' raises a typed error)."""
    src = os.path.join(root, Repository(root).store.list("packs/")[0])
    name = os.path.basename(src)[:31] + "\n"
    shutil.copy(src, os.path.join(os.path.dirname(src), name))
    with pytest.raises(StoreError):
        read_entries(Repository(root).store, name)
    rep = probe("rebuild", root)
    assert rep["outcome"] == "ok" and any(k.endswith("\n") for k in rep["skipped"]), rep
