"""deltackpt command line.  Every command takes --json for scripts.  Exit status (EXIT_CODES):
0 success, 1 verify found problems, 2 usage (argparse), 3 the command failed (one line on stderr
naming the version, tensor, file or object), 4 an internal error (a bug: one line, the traceback
with DELTACKPT_DEBUG=1), 130 interrupted."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any

import deltackpt
from deltackpt.errors import DeltackptError, InvalidArgumentError

from .render import emit_json, human_bytes, table, when


EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_ERROR, EXIT_BUG, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CODES = f"""exit status:
  {EXIT_OK}    success
  {EXIT_PROBLEMS}    verify found problems (the repository is damaged; the report names them)
  {EXIT_USAGE}    usage error (unknown command or option, an option's value out of range)
  {EXIT_ERROR}    the command failed: one line on stderr, `deltackpt: error: ...`, names the version,
       tensor, file or object (with --json also {{"error": {{"type", "message"}}}} on stdout)
  {EXIT_BUG}    internal error (a bug): one line; rerun with DELTACKPT_DEBUG=1 for the traceback
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)"""
MAX_MESSAGE = 2000


def _one_line(text: str) -> str:
    """Messages of other libraries (torch, safetensors) span lines; a CLI error is one."""
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " ..."


def _repo(args: argparse.Namespace, create: bool = False) -> Any:
    return deltackpt.Repo(args.repo, create=create)


def cmd_init(args: argparse.Namespace) -> int:
    repo = deltackpt.Repo.init(args.repo, **({"chunk_bytes": args.chunk_bytes} if args.chunk_bytes else {}),
                               **({"keyframe_interval": args.keyframe_interval} if args.keyframe_interval is not None else {}),
                               **({"delta_base": args.delta_base} if args.delta_base else {}))
    info = repo.core.info()
    if args.json:
        emit_json(info)
    else:
        print(f"initialized deltackpt repository at {info['location']} (format version {info['format_version']})")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    versions = _repo(args).log()
    if args.limit:
        versions = versions[: args.limit]
    if args.json:
        emit_json([v.to_json() for v in versions])
        return 0
    if not versions:
        print("no versions yet")
        return 0
    rows = []
    for v in versions:
        if v.error is not None:  # listed, not fatal: the other versions are still shown
            rows.append([v.short_id, "?", "?", "?", "?", ",".join(v.tags), "?", f"DAMAGED: {_one_line(v.error)}"])
            continue
        metrics = " ".join(f"{k}={val:.4g}" if isinstance(val, float) else f"{k}={val}" for k, val in v.metrics.items())
        rows.append([v.short_id, when(v.time), v.step, human_bytes(v.logical_bytes),
                     "?" if v.written_bytes is None else human_bytes(v.written_bytes),
                     ",".join(v.tags), "" if v.exact else "lossy", metrics])
    table(["version", "time", "step", "logical", "written", "tags", "exact", "metrics"], rows)
    damaged = sum(v.error is not None for v in versions)
    if damaged:
        print(f"deltackpt: {damaged} damaged version(s) listed; `deltackpt verify` names what is wrong",
              file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    info = _repo(args).show(args.version)
    if args.json:
        emit_json(info)
        return 0
    v = info["version"]
    print(f"version {v['id']}\nparent  {v['parent']}\ntime    {v['time_iso'] or '?'}\nstep    {v['step']}")
    print(f"tags    {', '.join(v['tags']) or '-'}\nexact   {'yes' if info['exact'] else 'no (lossy encodings)'}")
    if v["metrics"]:
        print("metrics " + ", ".join(f"{k}={val}" for k, val in v["metrics"].items()))
    logical = sum(t["logical_bytes"] for t in info["tensors"])
    stored = sum(t["stored_bytes"] for t in info["tensors"])
    print(f"tensors {len(info['tensors'])}, logical {human_bytes(logical)}, stored (chunk objects) {human_bytes(stored)}\n")
    table(["tensor", "dtype", "shape", "logical", "stored", "encoding", "max_abs_err"],
          [[t["name"], t["dtype"], "x".join(map(str, t["shape"])) or "()", human_bytes(t["logical_bytes"]),
            human_bytes(t["stored_bytes"]), t["encoding"], "" if t["exact"] else f"{t['max_abs_err']:.3g}"]
           for t in info["tensors"]])
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from deltackpt.integrations.files import check_output, export_file
    check_output(args.output)  # a missing folder is named before the version is loaded
    repo = _repo(args)
    state, version = repo.load(args.version, layers=args.layer or None, return_version=True)
    count = export_file(state, args.output, version_id=version.id)
    info = {"version": version.id, "output": args.output, "tensors": count, "bytes": os.path.getsize(args.output),
            "layers": args.layer or None}
    if args.json:
        emit_json(info)
    else:
        print(f"restored {count} tensors of version {version.short_id} to {args.output} ({human_bytes(info['bytes'])})")
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    repo = _repo(args)
    if args.delete:
        repo.untag(args.name)
        info: dict[str, Any] = {"deleted": args.name}
    else:
        v = repo.tag(args.name, args.version, force=args.force)
        info = {"tag": args.name, "version": v.id}
    if args.json:
        emit_json(info)
    else:
        print(f"deleted tag {args.name}" if args.delete else f"tagged {info['version'][:10]} as {args.name}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    report = deltackpt.gc(_repo(args), keep_last=args.keep_last, keep_tags=not args.no_keep_tags,
                          dry_run=args.dry_run, keep_best=args.keep_best, keep_every=args.keep_every,
                          keep_within=args.keep_within, rebase=not args.keep_bases,
                          grace_seconds=args.grace)
    if args.json:
        emit_json(report.to_json())
        return 0
    verb = "would remove" if report.dry_run else "removed"
    change = (f"reclaiming {human_bytes(report.reclaimed_bytes)}" if report.reclaimed_bytes >= 0 else
              f"the repository grows by {human_bytes(-report.reclaimed_bytes)} (delta chains rebased to keyframes)")
    print(f"{verb} {len(report.removed)} version(s), {change}")
    steps = getattr(report, "steps", {}) or {}
    for vid in report.removed:
        print(f"  - {vid[:10]}" + (f"  step {steps[vid]}" if steps.get(vid) is not None else ""))
    print(f"kept {len(report.kept)} version(s):")
    for vid, why in report.kept.items():
        step = f"  step {steps[vid]}" if steps.get(vid) is not None else ""
        print(f"  + {vid[:10]}{step}  ({', '.join(why)})")
    if not report.dry_run:
        print(f"packs deleted {report.packs_deleted}, rewritten {report.packs_rewritten}; chunks rebased to "
              f"keyframes {report.chunks_rebased}; delta bases kept {report.bases_kept}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = _repo(args).verify(read_data=not args.quick)
    if args.json:
        emit_json(report.to_json())
    else:
        for p in report.errors:
            print(f"ERROR {p.object}: {p.problem}" + (f" (versions {', '.join(v[:10] for v in p.versions)})"
                                                      if p.versions else ""))
        for p in report.warnings:
            print(f"warning {p.object}: {p.problem}")
        print(f"{'ok' if report.ok else 'FAILED'}: {report.versions_checked} versions, {report.packs_checked} packs, "
              f"{report.chunks_checked} chunks checked" + (f"; bad versions: {', '.join(v[:10] for v in report.bad_versions)}"
                                                          if report.bad_versions else ""))
    return 0 if report.ok else 1


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    report = _repo(args).rebuild_index()
    info = report.to_json() if hasattr(report, "to_json") else vars(report)
    if args.json:
        emit_json(info)
    else:
        print("rebuilt the index from the packs: " + ", ".join(f"{k} {v if not isinstance(v, (list, dict)) else len(v)}"
                                                            for k, v in info.items()))
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    info = _repo(args).du()
    if args.json:
        emit_json(info)
        return 0
    table(["version", "step", "logical", "written", "referenced", "unique"],
          [[r["short_id"], r["step"], human_bytes(r["logical_bytes"]), human_bytes(r["written_bytes"]),
            human_bytes(r["referenced_bytes"]), human_bytes(r["unique_bytes"])] for r in info["versions"]])
    t = info["total"]
    ratio = t["stored_bytes"] / t["logical_bytes"] if t["logical_bytes"] else 0
    print(f"\ntotal: {t['versions']} versions, logical {human_bytes(t['logical_bytes'])}, stored "
          f"{human_bytes(t['stored_bytes'])} ({ratio:.3f}x)")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    rows = _repo(args).diff(args.a, args.b)
    if args.json:
        emit_json(rows)
        return 0
    fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
    table(["tensor", "changed", "max_abs", "rel_l2", "stored_a", "stored_b"],
          [[r["name"], r.get("status") or f"{100 * r['changed_fraction']:.1f}%", fmt(r.get("max_abs")),
            fmt(r.get("rel_l2")), human_bytes(r.get("stored_bytes_a")), human_bytes(r.get("stored_bytes_b"))]
           for r in rows])
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """An imported file is weights, not a training state: it is committed off the training line
    (``latest`` does not move, so resume and the next save's history ignore it) under a tag, which
    also keeps it through gc."""
    from deltackpt.format.refs import check_name
    from deltackpt.integrations.files import import_file
    if args.tag is not None:
        check_name(args.tag)   # refused before the file is read or the repository created
    state = import_file(args.file)
    repo = _repo(args, create=True)
    tag = args.tag or _free_tag(repo, "import-" + _stem(args.file))
    v = deltackpt.save(state, repo, step=args.step, tag=tag, latest=False,
                       meta={"imported_from": os.path.basename(args.file)})
    latest = repo.core.latest()
    if args.json:
        emit_json({**v.to_json(), "tag": tag, "off_line": True, "latest": latest})
    else:
        head = f"'latest' still names {latest[:10]}" if latest else "'latest' is unset (no training version yet)"
        print(f"imported {args.file} as version {v.short_id}, tag {tag} ({human_bytes(v.logical_bytes)} logical, "
              f"{human_bytes(v.written_bytes)} written)\n"
              f"off the training line: {head}, so resume and gc's keep-last go by your training versions; "
              f"the tag keeps it (deltackpt restore {tag} -o FILE)")
    return 0


def _stem(path: str) -> str:
    name = os.path.basename(path).split(".")[0] or "file"
    return "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in name)[:100]


def _free_tag(repo: Any, base: str) -> str:
    """``base``, or ``base-2``, ``base-3``... the first no tag holds (a second import of a file of
    the same name); the commit still refuses one taken meanwhile."""
    taken = set(repo.tags())
    n, tag = 1, base
    while tag in taken:
        n += 1
        tag = f"{base}-{n}"
    return tag


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deltackpt", description="Incremental, compressed PyTorch checkpoints.",
                                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"deltackpt {deltackpt.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, func, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--repo", "-r", default=os.environ.get("DELTACKPT_REPO", "."),
                        help="repository path or URL (default: $DELTACKPT_REPO or .)")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=func)
        return sp

    sp = command("init", cmd_init, "create a repository")
    sp.add_argument("--chunk-bytes", type=int)
    sp.add_argument("--keyframe-interval", type=int)
    sp.add_argument("--delta-base", choices=["child", "parent", "keyframe"],
                    help="child (default): the newest version whole, older ones deltas against newer "
                         "chunks; parent: forward chains (cheaper saves, slower newest restore); "
                         "keyframe: deltas against each chunk's last keyframe")
    sp = command("log", cmd_log, "list versions, newest first")
    sp.add_argument("-n", "--limit", type=int)
    sp = command("show", cmd_show, "a version's metadata and tensors")
    sp.add_argument("version", nargs="?", default="latest")
    sp = command("restore", cmd_restore, "write a version (or some layers) to a .pt or .safetensors file")
    sp.add_argument("version", nargs="?", default="latest")
    sp.add_argument("--layer", action="append", help="module path to restore (repeatable)")
    sp.add_argument("-o", "--output", required=True)
    sp = command("tag", cmd_tag, "name a version")
    sp.add_argument("name")
    sp.add_argument("version", nargs="?", default="latest")
    sp.add_argument("-f", "--force", action="store_true", help="move an existing tag")
    sp.add_argument("-d", "--delete", action="store_true", help="delete the tag")
    sp = command("gc", cmd_gc, "remove versions outside the retention rules")
    sp.add_argument("--keep-last", type=int)
    sp.add_argument("--keep-best", help="METRIC:COUNT[:min|max], e.g. val_loss:2")
    sp.add_argument("--keep-every", type=int, help="keep one version every N steps")
    sp.add_argument("--keep-within", type=float, help="keep versions newer than this many seconds")
    sp.add_argument("--keep-tags", action="store_true", default=True, help="keep tagged versions (default)")
    sp.add_argument("--no-keep-tags", action="store_true", help="let gc remove tagged versions and their tags")
    sp.add_argument("--keep-bases", action="store_true", help="keep delta bases instead of rebasing chunks")
    sp.add_argument("--grace", type=float, default=600.0, help="seconds before unreferenced packs are deleted")
    sp.add_argument("--dry-run", action="store_true")
    sp = command("verify", cmd_verify, "re-hash every object; name every version a bad object belongs to")
    sp.add_argument("--quick", action="store_true", help="check structure only, do not decode chunks")
    command("du", cmd_du, "logical and stored bytes per version and in total")
    command("rebuild-index", cmd_rebuild_index, "re-derive the index from the pack headers (after a lost index file)")
    sp = command("diff", cmd_diff, "per-tensor differences between two versions")
    sp.add_argument("a")
    sp.add_argument("b", nargs="?", default="latest")
    sp = command("import", cmd_import, "import a .pt (weights only) or .safetensors file as a tagged version "
                 "off the training line ('latest' does not move)")
    sp.add_argument("file")
    sp.add_argument("--step", type=int)
    sp.add_argument("--tag", help="tag naming the import (default: import-<file name>, -2, -3... if taken)")
    return p


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
    text = _one_line(text)
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
