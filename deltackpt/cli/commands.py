"""One function per ``deltackpt`` command: call the public API, print text or ``--json``.

Each takes the parsed arguments and returns the exit status; failures propagate as exceptions
for :mod:`deltackpt.cli.main` to turn into one line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import deltackpt

from . import columns, events
from .render import emit_json, human_bytes, one_line, table, when

#: `verify` found problems (the other statuses are main's: they come from exceptions)
EXIT_PROBLEMS = 1


def _repo(args: argparse.Namespace, create: bool = False) -> Any:
    return deltackpt.Repo(args.repo, create=create)


def cmd_init(args: argparse.Namespace) -> int:
    """Create a repository; on an existing one change nothing and say so (exit 0, as a second
    `git init` does, so setup scripts may run it again), unless an option asks for a setting it
    does not have: a repository's settings are fixed at creation, so that is an error (exit 3)."""
    from deltackpt.errors import ConflictError, NotARepositoryError
    from deltackpt.format.config import check_chunk_bytes, check_delta_base, check_keyframe_interval
    options = {k: v for k, v in (("chunk_bytes", args.chunk_bytes), ("keyframe_interval", args.keyframe_interval),
                                 ("delta_base", args.delta_base)) if v is not None}
    for name, check in (("chunk_bytes", check_chunk_bytes), ("keyframe_interval", check_keyframe_interval),
                        ("delta_base", check_delta_base)):
        if name in options:
            check(options[name])   # a value no config can hold is a usage error, even for an existing repository
    try:
        repo, created = deltackpt.Repo(args.repo), False
    except NotARepositoryError:
        repo, created = deltackpt.Repo.init(args.repo, **options), True
    info = {**repo.info(), "created": created}
    if not created:
        differ = [f"{k} {info[k]!r} (asked: {v!r})" for k, v in options.items() if info[k] != v]
        if differ:
            raise ConflictError(f"{info['location']}: a repository already exists here with {', '.join(differ)}; "
                                "its settings are fixed at creation: nothing changed (init another folder)")
    if args.json:
        emit_json(info)
    elif created:
        print(f"initialized deltackpt repository at {info['location']} (format version {info['format_version']})")
    else:
        print(f"a deltackpt repository already exists at {info['location']} (format version "
              f"{info['format_version']}); nothing changed")
    return 0

def cmd_log(args: argparse.Namespace) -> int:
    versions = _repo(args).log(limit=args.limit or None)   # -n 0: every version, as without -n
    if args.json:
        emit_json([v.to_json() for v in versions])
        return 0
    if not versions:
        print("no versions yet")
        return 0
    rows = []
    for v in versions:
        if v.error is not None:  # listed, not fatal: the other versions are still shown
            rows.append([v.short_id, "?", "?", "?", "?", ",".join(v.tags), "?", f"DAMAGED: {one_line(v.error)}"])
            continue
        metrics = " ".join(f"{k}={val:.4g}" if isinstance(val, float) else f"{k}={val}" for k, val in v.metrics.items())
        label = events.rollback_label(v.meta)   # a divergence guard's re-save of the state it restored
        rows.append([v.short_id, when(v.time), v.step, human_bytes(v.logical_bytes),
                     "?" if v.written_bytes is None else human_bytes(v.written_bytes),
                     ",".join(v.tags), "" if v.exact else "lossy", "; ".join(x for x in (label, metrics) if x)])
    table(list(columns.LOG), rows)
    events.print_recent([e.to_json() for e in _repo(args).events()])
    damaged = sum(v.error is not None for v in versions)
    if damaged:
        print(f"deltackpt: {damaged} damaged version(s) listed; `deltackpt verify` names what is wrong",
              file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    info = _repo(args).show(args.version, layers=args.layer or None)
    if args.json:
        emit_json(info)
        return 0
    v = info["version"]
    print(f"version {v['id']}\nparent  {v['parent']}\ntime    {v['time_iso'] or '?'}\nstep    {v['step']}")
    print(f"tags    {', '.join(v['tags']) or '-'}\nexact   {'yes' if info['exact'] else 'no (lossy encodings)'}")
    if v["metrics"]:
        print("metrics " + ", ".join(f"{k}={val}" for k, val in v["metrics"].items()))
    if info.get("last_drill"):
        print("drill   " + events.describe_drill(info["last_drill"]))
    logical = sum(t["logical_bytes"] for t in info["tensors"])
    stored = sum(t["stored_bytes"] for t in info["tensors"])
    under = f" under {', '.join(args.layer)}" if args.layer else ""
    print(f"tensors {len(info['tensors'])}{under}, size {human_bytes(logical)}, stored {human_bytes(stored)} "
          "(the chunk objects it reads)\n")
    table(list(columns.SHOW),
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
    for line in gc_lines(report):
        print(line)
    return 0


def gc_lines(report: Any) -> list[str]:
    """gc's report in plain words: what went, what stayed and why, what happened to the files."""
    verb = "would remove" if report.dry_run else "removed"
    if report.reclaimed_bytes >= 0:
        change = f"{'freeing' if report.dry_run else 'freed'} {human_bytes(report.reclaimed_bytes)}"
    else:  # deltas built on a removed version become whole copies, which can be larger
        change = (f"the repository {'would grow' if report.dry_run else 'grew'} by "
                  f"{human_bytes(-report.reclaimed_bytes)} (kept chunks stored as deltas against removed "
                  "versions are stored whole again)")
    steps = report.steps or {}
    at = lambda vid: f"  step {steps[vid]}" if steps.get(vid) is not None else ""  # noqa: E731
    lines = [f"{verb} {len(report.removed)} version(s), {change}"]
    lines += [f"  - {vid[:10]}{at(vid)}" for vid in report.removed]
    lines.append(f"kept {len(report.kept)} version(s):")
    lines += [f"  + {vid[:10]}{at(vid)}  ({', '.join(why)})" for vid, why in report.kept.items()]
    if report.dry_run:
        return lines
    lines.append(f"pack files: {report.packs_deleted} deleted, {report.packs_rewritten} rewritten without "
                 "the removed versions' data")
    if report.chunks_rebased:
        lines.append(f"{report.chunks_rebased} chunk(s) of kept versions were stored as deltas against a "
                     "removed version: now stored whole")
    if getattr(report, "events_deleted", 0):
        lines.append(f"old drill records deleted: {report.events_deleted}")
    if report.bases_kept:
        lines.append(f"{report.bases_kept} chunk(s) of removed versions stay: kept versions' deltas are "
                     "built on them")
    return lines


def cmd_deltify(args: argparse.Namespace) -> int:
    report = _repo(args).deltify(lag=args.lag, **({"max_bytes": args.max_bytes} if args.max_bytes is not None else {}))
    if args.json:
        emit_json(report.to_json())
        return 0
    print(f"stored {report.chunks} whole chunk(s) of older versions as deltas against newer ones: wrote "
          f"{human_bytes(report.written_bytes)}, freed {human_bytes(report.freed_bytes)} "
          f"({report.seconds:.1f} s; the {args.lag} newest version(s) left as saved)")
    if report.remaining:
        print(f"{report.remaining} more chunk(s) left for a later run (--max-bytes reached)")
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
    return 0 if report.ok else EXIT_PROBLEMS


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    report = _repo(args).rebuild_index()
    info = report.to_json() if hasattr(report, "to_json") else vars(report)
    if args.json:
        emit_json(info)
    else:
        print("rebuilt the index from the packs: " + ", ".join(f"{k} {v if not isinstance(v, (list, dict)) else len(v)}"
                                                            for k, v in info.items()))
    return 0


DU_LEGEND = """\
size: the version's tensors and values as they are in memory (about what torch.save would write)
written: what its save added to the repository (its changed chunks whole, plus the previous
  version's replaced chunks stored again as deltas)
needs: the stored bytes a load of it reads, shared ones included
only its own: the stored bytes no other version uses (about what removing it alone frees)"""


def cmd_du(args: argparse.Namespace) -> int:
    info = _repo(args).du()
    if args.json:
        emit_json(info)
        return 0
    table(list(columns.DU),
          [[r["short_id"], r["step"], human_bytes(r["logical_bytes"]), human_bytes(r["written_bytes"]),
            human_bytes(r["referenced_bytes"]), human_bytes(r["unique_bytes"])] for r in info["versions"]])
    t = info["total"]
    ratio = t["stored_bytes"] / t["logical_bytes"] if t["logical_bytes"] else 0
    print(f"\n{DU_LEGEND}\n\ntotal: {t['versions']} versions holding {human_bytes(t['logical_bytes'])} of state "
          f"take {human_bytes(t['stored_bytes'])} on disk ({ratio:.3f}x)")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    rows = _repo(args).diff(args.a, args.b)
    if args.json:
        emit_json(rows)
        return 0
    fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
    table(list(columns.DIFF),
          [[r["name"], r.get("status") or _changed(r), fmt(r.get("max_abs")),
            fmt(r.get("rel_l2")), human_bytes(r.get("stored_bytes_a")), human_bytes(r.get("stored_bytes_b"))]
           for r in rows])
    return 0


def _changed(row: dict[str, Any]) -> str:
    """The "changed" cell of a diff row: a percentage, or why there is none."""
    if row.get("changed_fraction") is None:
        return row.get("note") or "?"
    return f"{100 * row['changed_fraction']:.1f}%"


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
    head = repo.latest()
    latest = head.id if head is not None else None
    if args.json:
        emit_json({**v.to_json(), "tag": tag, "off_line": True, "latest": latest})
    else:
        head = f"'latest' still names {latest[:10]}" if latest else "'latest' is unset (no training version yet)"
        print(f"imported {args.file} as version {v.short_id}, tag {tag} ({human_bytes(v.logical_bytes)} of state, "
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


def cmd_drill(args: argparse.Namespace) -> int:
    return events.cmd_drill(args, _repo(args))


def cmd_events(args: argparse.Namespace) -> int:
    return events.cmd_events(args, _repo(args))
