"""deltackpt command line: ``deltackpt [--repo PATH] [--json] COMMAND ...``.

Every command takes --json for scripts.  Exit status (EXIT_CODES in :mod:`.parser`): 0 success,
1 verify found problems (or a drill failed), 2 usage (argparse), 3 the command failed (one line on stderr naming the
version, tensor, file or object), 4 an internal error (a bug: one line, the traceback with
DELTACKPT_DEBUG=1), 130 interrupted.

Example::

    $ deltackpt --repo ckpt log        # or: deltackpt log --repo ckpt
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from deltackpt.errors import DeltackptError, InvalidArgumentError

from .parser import (EXIT_BUG, EXIT_CODES, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_PROBLEMS,  # noqa: F401
                     EXIT_USAGE, build_parser)
from .render import MAX_MESSAGE, emit_json, one_line  # noqa: F401

_one_line = one_line  # the name tests and older callers use


def _message(exc: BaseException) -> tuple[str, int]:
    """The one line and exit status for an exception a command raised."""
    if isinstance(exc, InvalidArgumentError):  # an option's value out of its range (--keep-within nan)
        return str(exc), EXIT_USAGE
    if isinstance(exc, DeltackptError):
        return str(exc), EXIT_ERROR
    if isinstance(exc, OSError):  # a path the user named: missing folder, a directory, permission
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}", EXIT_ERROR
    if isinstance(exc, ImportError):  # an optional dependency the command needs
        return f"missing dependency: {exc} (install it, e.g. pip install {exc.name or 'it'})", EXIT_ERROR
    if isinstance(exc, MemoryError):
        return f"out of memory ({exc})" if str(exc) else "out of memory", EXIT_ERROR
    return (f"internal error ({type(exc).__name__}: {exc}); rerun with DELTACKPT_DEBUG=1 for the "
            "traceback and report it", EXIT_BUG)


def _fail(args: argparse.Namespace, exc: BaseException) -> int:
    text, code = _message(exc)
    text = one_line(text)
    if os.environ.get("DELTACKPT_DEBUG"):
        traceback.print_exc()
    if getattr(args, "json", False):
        emit_json({"error": {"type": type(exc).__name__, "message": text}})
    print(f"deltackpt: error: {text}", file=sys.stderr)
    return code


def _quiet_broken_pipe() -> int:
    """`deltackpt log | head`: the reader left; exit quietly, not with a second error when Python
    flushes stdout at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (``sys.exit(main(["log", "--repo", "ckpt"]))``)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        print("deltackpt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001  every failure is one line and a documented status
        return _fail(args, exc)


if __name__ == "__main__":
    sys.exit(main())
