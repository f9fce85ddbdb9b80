"""The CLI's view of event records: ``deltackpt drill``, ``deltackpt events`` and the lines
``log`` and ``show`` add about rollbacks and drills (and the label of a version a rollback
committed)."""

from __future__ import annotations

import argparse
from typing import Any

from . import columns
from .render import emit_json, human_bytes, table, when


def _fields(record: dict[str, Any]) -> dict[str, Any]:
    """A record's fields: ``Event.to_json()`` nests them under ``data``; a DrillReport's are flat."""
    return {**record["data"], "id": record.get("id")} if isinstance(record.get("data"), dict) else record


def describe_drill(d: dict[str, Any]) -> str:
    """One line about a drill record (``Event.to_json()`` or ``DrillReport.to_json()``)."""
    d = _fields(d)
    verdict = "restored bit-identical" if d.get("ok") else f"FAILED ({d.get('error')})"
    at = f" at {when(d['time'])}" if d.get("time") is not None else ""
    return (f"drill of {str(d.get('version'))[:10]} ({d.get('revision', '?')}){at}: {verdict} in "
            f"{d.get('seconds', 0):.3g} s, {human_bytes(d.get('bytes_read'))} read")


def describe_rollback(e: dict[str, Any]) -> str:
    e = _fields(e)
    skipped = e.get("skipped")
    data = str(e.get("data", "?")) + (f" {skipped[0]}..{skipped[1]}" if skipped else "")
    return (f"step {e.get('step')}: {e.get('metric')}={e.get('value'):.4g} ({e.get('rule')}), bad since step "
            f"{e.get('bad_start')} -> {str(e.get('version'))[:10]} (step {e.get('to_step')}), data {data}, "
            f"{human_bytes(e.get('bytes_read'))} read in {e.get('seconds', 0):.3g} s")


def rollback_label(meta: Any) -> str:
    """What ``log`` says of a version a divergence guard committed after a rollback (its meta
    names the version restored), or "" for any other version."""
    rb = meta.get("rollback") if isinstance(meta, dict) else None
    if not isinstance(rb, dict) or not isinstance(rb.get("to"), str):
        return ""
    return f"rollback to {rb['to'][:10]} (step {rb.get('to_step')}) at step {rb.get('at_step')}"


def print_recent(rows: list[dict[str, Any]], limit: int = 5) -> None:
    """What ``log`` prints under the versions: the last rollbacks and the last drill."""
    rollbacks = [e for e in rows if e.get("kind") == "rollback"][:limit]
    drill = next((e for e in rows if e.get("kind") == "drill"), None)
    damaged = sum(e.get("kind") == "damaged" for e in rows)
    if rollbacks:
        print("\nrollbacks (newest first):")
        for e in rollbacks:
            print(f"  {when(e['time'])}  {describe_rollback(e)}")
    if drill is not None:
        print(f"\nlast {describe_drill(drill)}")
    if damaged:
        print(f"\n{damaged} event record(s) do not parse; `deltackpt verify` names them")


def cmd_events(args: argparse.Namespace, repo: Any) -> int:
    rows = [e.to_json() for e in repo.events()]
    if args.limit:
        rows = rows[: args.limit]
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        print("no events yet")
        return 0
    table(list(columns.EVENTS),
          [[r["id"][:10], when(r["time"]) if r.get("time") is not None else "?", r["kind"],
            describe_rollback(r) if r["kind"] == "rollback" else describe_drill(r) if r["kind"] == "drill"
            else r["data"].get("error", "")] for r in rows])
    return 0


def cmd_drill(args: argparse.Namespace, repo: Any) -> int:
    report = repo.drill(args.version, threads=args.threads, record=not args.no_record)
    if args.json:
        emit_json(report.to_json())
    else:
        recorded = "" if report.event is None else f" (recorded as {report.event[:10]})"
        print(describe_drill(report.to_json()) + recorded)
    return 0 if report.ok else 1
