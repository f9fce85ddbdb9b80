"""Every code block of README.md and docs/ runs as written (tests/docs_snippets.py says how), and
the README's links work on a package index page (absolute, pointing where pyproject.toml says)."""

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
        return tomllib.load(f)["project"]["urls"]


def test_readme_links_are_absolute_and_match_the_project_urls():
    """A package index shows the README away from the repository: relative links would break.  The
    repository and documentation addresses are the ones pyproject.toml and mkdocs.yml name."""
    urls = _project_urls()
    repo, docs = urls["Repository"], urls["Documentation"]
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        mkdocs = f.read()
    assert f"site_url: {docs}" in mkdocs and f"repo_url: {repo}" in mkdocs
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for target in re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r"<(https?://[^>]+)>", readme):
        assert target.startswith(("https://", "http://", "#")), f"relative link in README.md: {target}"
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for url in re.findall(r"https://(?:github\.com/deltackpt|deltackpt\.github\.io)[^)\s>\"']*", text):
            assert url.startswith((repo.rstrip("/"), docs.rstrip("/"))), f"{os.path.relpath(page, ROOT)}: {url}"
