"""Every code block of README.md and docs/ runs as written (tests/docs_snippets.py says how), and
the pages link only to files of the repository and to addresses the project publishes."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

from tests import docs_snippets
from tests.conftest import ROOT

PAGES = sorted([os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)])
RUNNABLE = [p for p in PAGES if docs_snippets.runnable(p)]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: os.path.relpath(p, ROOT))
def test_page_runs_as_written(page, tmp_path):
    """The page's python blocks and deltackpt commands, in order, in a fresh folder, succeed and
    print what the page shows."""
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "docs_snippets.py"), page], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode == 5:
        pytest.skip(proc.stdout.strip())
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"


def test_the_pages_have_blocks_to_run():
    assert os.path.join(ROOT, "README.md") in RUNNABLE and len(RUNNABLE) >= 10, RUNNABLE


def test_a_wrong_block_fails_the_page(tmp_path):
    """A raising python block, a failing command or output that differs from the page each fail it;
    a no-run block is skipped; numbers within 25% and other ids or times still match."""
    def page(text: str) -> int:
        path = tmp_path / "page.md"
        path.write_text(text)
        return subprocess.run([sys.executable, os.path.join(ROOT, "tests", "docs_snippets.py"), str(path)],
                              cwd=tmp_path, capture_output=True, env={**os.environ, "PYTHONPATH": ROOT},
                              timeout=300).returncode

    assert page("```python\nraise ValueError('no')\n```\n") == 1
    assert page("<!-- no-run -->\n```python\nraise ValueError('no')\n```\n") == 0
    assert page("```sh\ndeltackpt log --repo nowhere\n```\n") == 1
    assert page("```console\n$ deltackpt init --repo r\nsomething else\n```\n") == 1
    assert page("```console\n$ deltackpt log --repo r\nno versions yet\n```\n") == 0
    assert page("```console\n$ deltackpt log --repo r\nno versions at all\n```\n") == 1
    assert docs_snippets.same_output(["abcdef1234  2026-01-01 10:00:00  100  1.0 MiB  loss=0.5"],
                                     ["0123456789  2027-02-02 11:11:11  100  1.1 MiB  loss=0.55"])
    assert not docs_snippets.same_output(["x  100  1.0 MiB"], ["x  100  2.0 MiB"])
    assert docs_snippets.same_output(["a", "...", "z"], ["a", "b", "c", "z"])
    with pytest.raises(ValueError, match="mixes"):
        docs_snippets.commands(docs_snippets.Block("sh", 1, "pip install x\ndeltackpt log\n", False))


def _project_urls() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"].get("urls", {})


#: what the project publishes: nothing yet (no package index page, no documentation site, no public
#: repository).  Add an address here, to pyproject.toml's [project.urls] and to mkdocs.yml only once
#: it exists.
PUBLISHED: dict[str, str] = {}
#: addresses that would be the project's own: a page may name one only once pyproject.toml does
OWN_ADDRESS = re.compile(r"https?://(?:(?:www\.)?github\.com/deltackpt|deltackpt\.github\.io|(?:test\.)?pypi\.org/project/deltackpt)"
                         r"[^)\s>\"'`]*")
TOP_PAGES = ["README.md", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md"]


def test_links_lead_to_files_or_to_addresses_the_project_publishes():
    """Nothing is published yet (no package index page, documentation site or public repository),
    so pyproject.toml names no project URL and mkdocs.yml no site_url or repo_url: the two agree,
    and name the same addresses once there are some.  No page (README, CHANGELOG, SECURITY,
    CONTRIBUTING, docs/) links to an address of the project's that they do not name, and every
    relative link of the top-level pages leads to a file of the repository."""
    urls = _project_urls()
    assert urls == PUBLISHED, f"pyproject.toml names {urls}; what exists: {PUBLISHED}"
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        mkdocs = f.read()
    for key, setting in (("Documentation", "site_url"), ("Repository", "repo_url")):
        named = re.findall(rf"^{setting}:\s*(\S+)", mkdocs, flags=re.M)
        assert named == ([urls[key]] if key in urls else []), (setting, named, urls.get(key))
    published = tuple(u.rstrip("/") for u in urls.values())
    for page in sorted({*PAGES, *(os.path.join(ROOT, p) for p in TOP_PAGES)}) + [os.path.join(ROOT, "pyproject.toml"),
                                                                              os.path.join(ROOT, "mkdocs.yml")]:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(page, ROOT)
        for url in OWN_ADDRESS.findall(text):
            assert published and url.startswith(published), f"{rel}: {url} is not an address the project publishes"
        if rel in TOP_PAGES:
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if not target.startswith(("https://", "http://", "#", "mailto:")):
                    path = os.path.join(ROOT, target.split("#")[0])
                    assert os.path.exists(path), f"{rel}: the link {target} leads to no file"


def test_the_first_install_line_installs_from_the_clone_or_a_built_wheel():
    """No package index serves deltackpt, so the README's and the home page's first install command
    installs the clone (`pip install .`), as the fresh-venv check of issue 33 did, not a name pip
    would look up."""
    for page in ("README.md", os.path.join("docs", "index.md")):
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            first = next(line for line in f if line.startswith("pip install"))
        assert first.split("#")[0].split() == ["pip", "install", "."], (page, first)
