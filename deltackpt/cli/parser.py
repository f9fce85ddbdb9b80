"""The ``deltackpt`` command line's grammar: commands, options, exit statuses.

``--repo`` and ``--json`` are global: they may stand before the command
(``deltackpt --repo ckpt log``) or after it (``deltackpt log --repo ckpt``); given in both places,
the one after the command wins.  docs/cli.md is generated from this parser
(``python -m deltackpt.cli.reference``), and a test checks that it is."""

from __future__ import annotations

import argparse
import os
import textwrap
from typing import Any, Callable

import deltackpt

from ..api.repo import DEFAULT_DELTIFY_LAG
from . import commands

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_ERROR, EXIT_BUG, EXIT_INTERRUPTED = 0, commands.EXIT_PROBLEMS, 2, 3, 4, 130
EXIT_MEANINGS = [
    (EXIT_OK, "success"),
    (EXIT_PROBLEMS, "verify found problems (the repository is damaged; the report names them), or a drill "
                    "failed (the version does not restore; the report names the chunk)"),
    (EXIT_USAGE, "usage error (unknown command or option, an option's value out of range)"),
    (EXIT_ERROR, "the command failed: one line on stderr, `deltackpt: error: ...`, names the version, "
                 "tensor, file or object (with --json also {\"error\": {\"type\", \"message\"}} on stdout)"),
    (EXIT_BUG, "internal error (a bug): one line; rerun with DELTACKPT_DEBUG=1 for the traceback"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
]
EXIT_CODES = "exit status:\n" + "\n".join(
    textwrap.fill(text, 96, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7) for code, text in EXIT_MEANINGS)
GRACE_HELP = ("seconds (default 600): a pack file no index names yet may belong to a save still running "
              "in another process, so gc deletes such files only once they are older than this")


def _global_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """--repo and --json, on the top parser (with defaults) and on each command (without: a value
    given before the command is not overwritten by the command's default)."""
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS
    parser.add_argument("--repo", "-r", default=default(os.environ.get("DELTACKPT_REPO", ".")),
                        metavar="PATH",
                        help="repository path or URL (default: $DELTACKPT_REPO or .)")
    parser.add_argument("--json", action="store_true", default=default(False), help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; ``build_parser().parse_args(["log", "--repo", "ckpt"])``."""
    p = argparse.ArgumentParser(prog="deltackpt", description="Incremental, compressed PyTorch checkpoints.",
                                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"deltackpt {deltackpt.__version__}")
    _global_options(p, defaults=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        _global_options(sp, defaults=False)
        sp.set_defaults(func=func)
        return sp

    _init(command("init", commands.cmd_init, "create a repository (on an existing one: change nothing, say so, "
                  "exit 0; exit 3 if an option asks for another setting than it has)"))
    sp = command("log", commands.cmd_log, "list versions, newest first")
    sp.add_argument("-n", "--limit", type=int, metavar="N", help="list only the newest N")
    sp = command("show", commands.cmd_show, "a version's metadata and tensors")
    sp.add_argument("version", nargs="?", default="latest", help="which version (default: latest)")
    sp.add_argument("--layer", action="append", metavar="MODULE",
                    help="list only the tensors under this module path (repeatable; `encoder` also "
                         "selects `model.encoder`)")
    _restore(command("restore", commands.cmd_restore,
                     "write a version (or some layers) to a .pt or .safetensors file"))
    _tag(command("tag", commands.cmd_tag, "name a version"))
    _gc(command("gc", commands.cmd_gc, "remove versions outside the retention rules"))
    sp = command("deltify", commands.cmd_deltify, "store what older versions hold whole as deltas against "
                 "newer versions (saves do it in the background, gc too)")
    sp.add_argument("--lag", type=int, default=DEFAULT_DELTIFY_LAG, metavar="N",
                    help=f"the N newest versions are left as saved (default {DEFAULT_DELTIFY_LAG})")
    sp.add_argument("--max-bytes", type=int, metavar="BYTES", help="re-encode at most this many bytes of whole chunks")
    sp = command("verify", commands.cmd_verify, "re-hash every object; name every version a bad object belongs to")
    sp.add_argument("--quick", action="store_true", help="check structure only, do not decode chunks")
    command("du", commands.cmd_du, "disk use: each version's size, what its save wrote, what it shares")
    command("rebuild-index", commands.cmd_rebuild_index,
            "re-derive the index from the pack headers (after a lost index file)")
    sp = command("diff", commands.cmd_diff, "per-tensor differences between two versions")
    sp.add_argument("a", help="the older version")
    sp.add_argument("b", nargs="?", default="latest", help="the newer version (default: latest)")
    sp = command("drill", commands.cmd_drill, "restore a version into fresh memory, check it against its hashes, "
                 "measure and record the time and bytes read (exit 1 when it fails)")
    sp.add_argument("version", nargs="?", default="latest", help="revision to drill (default latest; latest~1, ...)")
    sp.add_argument("--threads", type=_positive_int, metavar="N", help="decode threads (default: every core)")
    sp.add_argument("--no-record", action="store_true", help="do not record the drill in the repository")
    sp = command("events", commands.cmd_events, "a divergence guard's rollbacks and the rollback drills, newest "
                 "first (--json: each as {id, kind, time, data}, data as Repo.events() gives it)")
    sp.add_argument("-n", "--limit", type=int, metavar="N", help="show the N newest")
    sp = command("import", commands.cmd_import, "import a .pt (weights only) or .safetensors file as a tagged "
                 "version off the training line ('latest' does not move)")
    sp.add_argument("file", help="the .pt or .safetensors file")
    sp.add_argument("--step", type=int, metavar="N", help="the step to record")
    sp.add_argument("--tag", metavar="NAME", help="tag naming the import (default: import-<file name>, -2, -3... if taken)")
    return p


def _init(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--chunk-bytes", type=int, metavar="BYTES", help="bytes per chunk (default 2 MiB)")
    sp.add_argument("--keyframe-interval", type=int, metavar="N",
                    help="store a chunk whole at least every N versions, bounding delta chains (default 8)")
    sp.add_argument("--delta-base", choices=["child", "parent", "keyframe"], metavar="BASE",
                    help="child (default): a save writes each changed chunk once (a small delta, or whole), "
                         "older versions become deltas against newer ones later; parent: every change a "
                         "delta against the previous save (smaller saves, slower newest restore); "
                         "keyframe: deltas against each chunk's last keyframe")


def _restore(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("version", nargs="?", default="latest", help="which version (default: latest)")
    sp.add_argument("--layer", action="append", metavar="MODULE", help="module path to restore (repeatable)")
    sp.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write: .pt or .safetensors")


def _tag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("name", help="the tag: letters, digits, . _ -; not latest or HEAD, not starting with best, not 4+ hex digits")
    sp.add_argument("version", nargs="?", default="latest", help="which version (default: latest)")
    sp.add_argument("-f", "--force", action="store_true", help="move an existing tag")
    sp.add_argument("-d", "--delete", action="store_true", help="delete the tag")


def _gc(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--keep-last", type=int, metavar="N", help="keep latest and its N-1 ancestors")
    sp.add_argument("--keep-best", metavar="RULE", help="METRIC:COUNT[:min|max], e.g. val_loss:2 (lower is better by default)")
    sp.add_argument("--keep-every", type=int, metavar="STEPS", help="keep one version every N steps")
    sp.add_argument("--keep-within", type=float, metavar="SECONDS", help="keep versions newer than this many seconds")
    sp.add_argument("--keep-tags", action="store_true", default=True, help="keep tagged versions (default)")
    sp.add_argument("--no-keep-tags", action="store_true", help="let gc remove tagged versions and their tags")
    sp.add_argument("--keep-bases", action="store_true",
                    help="keep the chunks of removed versions that kept deltas are built on, instead of "
                         "storing those deltas whole again")
    sp.add_argument("--grace", type=float, default=600.0, metavar="SECONDS", help=GRACE_HELP)
    sp.add_argument("--dry-run", action="store_true", help="say what would go; take no lock, write nothing")


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n
