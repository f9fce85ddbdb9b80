"""--repo and --json stand before or after the command; du and gc explain their figures in words."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

import deltackpt
from deltackpt.cli.parser import build_parser
from tests.conftest import ROOT, run_cli


def _two_versions(path: str) -> list:
    model = torch.nn.Linear(64, 64)
    out = []
    for step in (1, 2):
        with torch.no_grad():
            model.weight[0].add_(1.0)
        out.append(deltackpt.save(model, path, step=step))
    return out


def test_global_options_before_or_after_the_command(tmp_path):
    """`deltackpt --repo R log` and `deltackpt log --repo R` list the same versions; --json and -r too."""
    path = str(tmp_path / "r")
    versions = _two_versions(path)
    ids = [v.id for v in reversed(versions)]
    for argv in (["--repo", path, "--json", "log"], ["log", "--repo", path, "--json"],
                 ["--json", "log", "-r", path], ["-r", path, "log", "--json"]):
        assert [v["id"] for v in json.loads(run_cli(*argv).stdout)] == ids, argv
    assert versions[1].short_id in run_cli("--repo", path, "log").stdout


def test_an_option_after_the_command_wins_and_the_environment_is_the_default(monkeypatch):
    """Given twice, the value after the command counts; neither given, $DELTACKPT_REPO then '.'."""
    args = build_parser().parse_args(["--repo", "a", "log", "--repo", "b"])
    assert args.repo == "b" and args.json is False
    assert build_parser().parse_args(["--repo", "a", "--json", "log"]).repo == "a"
    monkeypatch.setenv("DELTACKPT_REPO", "from-env")
    assert build_parser().parse_args(["log"]).repo == "from-env"
    monkeypatch.delenv("DELTACKPT_REPO")
    assert build_parser().parse_args(["gc", "--dry-run"]).repo == "."


def test_du_and_gc_say_what_their_figures_mean(tmp_path):
    """du labels its columns in words and explains each; gc names what happened to the files."""
    path = str(tmp_path / "r")
    _two_versions(path)
    du = run_cli("du", "--repo", path).stdout
    for word in ("size", "written", "needs", "only its own", "on disk"):
        assert word in du, du
    assert "referenced" not in du and "unique" not in du
    gc = run_cli("gc", "--repo", path, "--keep-last", "1", "--grace", "0").stdout
    assert "removed 1 version(s), freed" in gc and "pack files:" in gc, gc
    assert "rebased" not in gc and "keyframes" not in gc


def test_dcp_is_an_attribute_after_a_bare_import():
    """`import deltackpt` then `deltackpt.dcp.Writer` works (the submodule is imported at first use)."""
    code = "import deltackpt, sys; assert 'deltackpt.dcp' not in sys.modules; print(deltackpt.dcp.Writer.__name__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "Writer", proc.stderr[-2000:]
