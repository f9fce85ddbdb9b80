"""mkdocs hook (mkdocs.yml ``hooks:``): the docstrings are written for Python's help() and use
Sphinx roles (:func:`~deltackpt.save`), and some older ones ``Example::``; the API pages show those
as code and ``Example:``, so a docstring reads well in both places without a second spelling.  (The
public API's docstrings are Google style, whose Args/Returns/Raises mkdocstrings renders as
sections.)"""

from __future__ import annotations

import re
from typing import Any

# after markdown: ":func:" then the role's target as code (a leading ~ shows the last name only)
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):<code>(~?)([\w.]+)</code>")


def _target(match: re.Match) -> str:
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{name}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(_target, html).replace("Example::", "Example:")
