"""docs/cli.md is the parser's own reference: regenerated, it is byte for byte the committed page."""

from __future__ import annotations

import argparse
import os

from deltackpt.cli.parser import EXIT_MEANINGS, build_parser
from deltackpt.cli.reference import EXAMPLES, render
from tests.conftest import ROOT


def test_docs_cli_page_is_current():
    """A new command, option or help text changes the page: regenerate it with
    `python -m deltackpt.cli.reference > docs/cli.md`."""
    with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == render(), "docs/cli.md is stale: python -m deltackpt.cli.reference > docs/cli.md"


def test_every_command_has_an_example_and_every_exit_status_a_row():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(EXAMPLES)
    page = render()
    for code, _text in EXIT_MEANINGS:
        assert f"| {code} |" in page
