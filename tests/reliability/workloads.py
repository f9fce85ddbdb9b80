"""The fault-site workloads (first save, incremental save, tag, gc, deltify): how to set each up,
run it under a fault and judge the result with the oracle."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from harness import Child, Zygote, oracle


@dataclass
class Template:
    """A repository made by clean jobs, copied before each faulted run."""

    path: str | None
    committed: list[tuple[str, str]] = field(default_factory=list)
    expected: dict[int, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


WORKLOADS = ("first", "incr", "tag", "gc", "deltify")


def job_for(workload: str) -> tuple[str, dict]:
    if workload == "first":
        return "save", {"steps": 1}
    if workload == "incr":
        return "save", {"steps": 2, "arm_after": 1}
    if workload == "tag":
        return "tag", {"name": "t1"}
    if workload == "deltify":
        return "deltify", {"lag": 1}
    return "gc", {"keep_last": 2}


def make_template(zygote: Zygote, workload: str, base: str) -> Template:
    if workload in ("first", "incr"):
        return Template(None)
    path = os.path.join(base, f"template-{workload}")
    c = zygote.run("save", path, steps=4)
    assert "DONE" in c.lines(), c.text()
    t = Template(path, c.committed(), c.attempts())
    if workload == "gc":
        # an old tagged version: gc must keep it and rebase what it shares deltas with
        c2 = zygote.run("tag", path, name="old", version=t.committed[0][0])
        assert "DONE" in c2.lines(), c2.text()
        t.tags["old"] = t.committed[0][0]
    return t


def fresh_copy(t: Template, dest: str) -> str:
    if t.path is not None:
        shutil.copytree(t.path, dest)
    return dest


def judge(workload: str, t: Template, repo: str, c: Child, *, next_save: bool = True):
    """Run the oracle on ``repo`` after job ``c`` of ``workload`` was faulted; returns OracleResult."""
    committed = t.committed + c.committed()
    expected = {**t.expected, **c.attempts()}
    must_exist = None
    if workload == "gc":
        must_exist = {v for v, _ in t.committed[-2:]} | set(t.tags.values())
    if workload == "tag":
        import deltackpt
        tags = deltackpt.Repo(repo).tags()
        assert tags.get("t1") in (None, t.committed[-1][0]), f"tag t1 names {tags.get('t1')}"
        if any(line.startswith("TAGGED") for line in c.lines()):
            assert tags.get("t1") == t.committed[-1][0], "tag() returned but the tag is missing"
    if workload == "gc" and any(line.startswith("GC") for line in c.lines()):
        from deltackpt.repo.repository import Repository
        left = set(Repository(repo).version_ids())
        assert left == must_exist, f"gc returned but versions {left ^ must_exist} are wrong"
    return oracle(repo, expected=expected, committed=committed, must_exist=must_exist, next_save=next_save)
