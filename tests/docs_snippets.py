"""Code blocks of the project's markdown, extracted and run as a reader would run them.

``blocks(path)`` finds every fenced block; ``runnable(...)`` keeps the ```python blocks and the
```sh / ```console blocks made of ``deltackpt`` commands; ``python tests/docs_snippets.py FILE.md``
runs one file's blocks in order, in the current folder, in one Python namespace (a page's later
blocks use what its earlier ones made), each ``deltackpt`` command through the CLI's ``main`` in the
same process (its output captured at the file descriptors).  A block
preceded by the line ``<!-- no-run -->`` is skipped (an s3:// URL, say).  A ```console block's
output lines are compared with what the command prints: version ids and times are free, numbers
may differ by 25% (a different CPU rounds, and compresses, a little differently), a line ``...``
stands for any lines.  tests/test_docs_snippets.py runs every page this way."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import sys
import tempfile
import traceback

NO_RUN = "<!-- no-run -->"
SHELLS = {"sh", "bash", "shell", "console"}
#: packages only the extras bring: a block that needs a missing one skips the rest of its page
OPTIONAL = {"pytorch_lightning", "lightning_fabric", "lightning", "transformers", "accelerate", "s3fs", "omegaconf"}


@dataclasses.dataclass
class Block:
    lang: str
    line: int              # 1-based line of the opening fence
    text: str
    no_run: bool


@dataclasses.dataclass
class Command:
    argv: list[str]
    expected: list[str] | None   # console output lines to compare, None when the block shows none


def blocks(path: str) -> list[Block]:
    """Every fenced code block of a markdown file, in order."""
    lines = open(path, encoding="utf-8").read().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```+\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        no_run = start > 0 and lines[start - 1].strip() == NO_RUN
        out.append(Block(lang, start + 1, "\n".join(body) + "\n", no_run))
        i += 1
    return out


def commands(block: Block) -> list[Command] | None:
    """The deltackpt commands of a shell block; None if it has none; ValueError if it mixes them with
    other commands (split the block, or mark it no-run)."""
    if block.lang == "console":
        cmds: list[Command] = []
        others = []
        for line in block.text.splitlines():
            if line.startswith("$ "):
                (cmds if line[2:].startswith("deltackpt ") else others).append(Command(shlex.split(line[2:], comments=True), None))
            elif cmds and not others:
                cmds[-1].expected = (cmds[-1].expected or []) + [line]
    else:
        lines = [s.strip() for s in block.text.splitlines() if s.strip() and not s.strip().startswith("#")]
        cmds = [Command(shlex.split(s, comments=True), None) for s in lines if s.startswith("deltackpt ")]
        others = [s for s in lines if not s.startswith("deltackpt ")]
    if cmds and others:
        raise ValueError(f"line {block.line}: a {block.lang} block mixes deltackpt commands with others")
    return cmds or None


def runnable(path: str) -> list[tuple[Block, list[Command] | None]]:
    """The blocks the test runs: python blocks (commands None) and deltackpt shell blocks."""
    out = []
    for b in blocks(path):
        if b.no_run:
            continue
        if b.lang == "python":
            out.append((b, None))
        elif b.lang in SHELLS:
            cmds = commands(b)
            if cmds:
                out.append((b, cmds))
    return out


_ID = re.compile(r"\b[0-9a-f]{10,32}\b")
_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\dZ?")


def _number(token: str) -> float | None:
    try:
        return float(token.rstrip("%x,)").lstrip("(+"))
    except ValueError:
        return None


def _same_token(want: str, got: str) -> bool:
    if want == got:
        return True
    if "=" in want and "=" in got:   # metric=value
        (wk, wv), (gk, gv) = want.split("=", 1), got.split("=", 1)
        return wk == gk and _same_token(wv, gv)
    a, b = _number(want), _number(got)
    return a is not None and b is not None and math.isclose(a, b, rel_tol=0.25, abs_tol=1e-9)


def _same_line(want: str, got: str) -> bool:
    w, g = _TIME.sub("<time>", _ID.sub("<id>", want)).split(), _TIME.sub("<time>", _ID.sub("<id>", got)).split()
    return len(w) == len(g) and all(_same_token(a, b) for a, b in zip(w, g))


def same_output(expected: list[str], got: list[str]) -> bool:
    """Lines match one for one (``...`` matches any number of lines)."""
    expected = [e for e in expected if e.strip()]
    got = [g for g in got if g.strip()]
    if not expected:
        return not got
    if expected[0].strip() == "...":
        return any(same_output(expected[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and _same_line(expected[0], got[0]) and same_output(expected[1:], got[1:])


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """Run the deltackpt command in this process (no interpreter and torch import per command):
    its exit status, stdout and stderr, captured at the file descriptors."""
    from deltackpt.cli.main import main

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            code = main(argv)
        except SystemExit as exc:   # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def run_command(cmd: Command) -> str | None:
    """Run one deltackpt command; the failure as text, or None."""
    code, stdout, stderr = _cli(cmd.argv[1:])
    shown = " ".join(cmd.argv)
    if code != 0:
        return f"`{shown}` exited {code}: {stderr.strip()[-1500:]}"
    if cmd.expected is not None and not same_output(cmd.expected, stdout.splitlines()):
        return f"`{shown}` printed:\n{stdout}\nbut the page shows:\n" + "\n".join(cmd.expected)
    return None


def run_page(path: str) -> int:
    """Run a page's blocks in order; 0 when all pass, 1 on the first failure, 5 when a block needs a
    missing optional package (the rest of the page is skipped)."""
    namespace: dict = {"__name__": "__main__"}
    for block, cmds in runnable(path):
        where = f"{os.path.relpath(path)}:{block.line}"
        if cmds is None:
            try:
                exec(compile(block.text, where, "exec"), namespace)
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] in OPTIONAL:
                    print(f"SKIP {where}: needs {exc.name}")
                    return 5
                raise
            except Exception:
                print(f"FAILED {where}: the python block raised\n{traceback.format_exc()}")
                return 1
            continue
        for cmd in cmds:
            error = run_command(cmd)
            if error:
                print(f"FAILED {where}: {error}")
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_page(sys.argv[1]))
