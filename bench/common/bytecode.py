"""The package's bytecode compiled before a fresh process is timed, as installing it leaves it.

``pip install`` compiles every module of a wheel (torch's included) into ``__pycache__``; an
editable checkout gets its bytecode written at first import, unless the environment forbids it
(``PYTHONDONTWRITEBYTECODE``, set on the project machine).  There, every fresh process
compiled deltackpt's ~55 read-path modules from source (~70 ms on the project machine) while
``torch.load``'s ran from bytecode: a cost no installed user pays.  The studies that time a fresh
process's first load wrap their children in :func:`compiled`.

Example::

    with compiled(ROOT):
        run_children()
"""

from __future__ import annotations

import compileall
import contextlib
import os
import shutil
from collections.abc import Iterator


@contextlib.contextmanager
def compiled(*roots: str) -> Iterator[None]:
    """Compile the ``deltackpt`` package under each of ``roots`` into its ``__pycache__`` folders
    for the block; the folders it made are removed after it, so the checkout is left as found."""
    made: list[str] = []
    try:
        for root in roots:
            package = os.path.join(root, "deltackpt")
            before = {d for d, _sub, _files in os.walk(package) if os.path.basename(d) == "__pycache__"}
            compileall.compile_dir(package, quiet=1)
            made += [d for d, _sub, _files in os.walk(package)
                     if os.path.basename(d) == "__pycache__" and d not in before]
        yield
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
