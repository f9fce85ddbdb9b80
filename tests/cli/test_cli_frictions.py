"""Frictions of the real ``deltackpt`` command (a subprocess) and of layer loads (issue 33, item 5):
a misspelt revision gets a suggestion, a write where no folder can be made names the path and
the OS's reason, ``show --layer`` lists one module, every column is documented, and
``load(layers=...)`` returns only the selected subtrees."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest
import torch

import deltackpt
from deltackpt.cli import columns
from deltackpt.cli import main as cli
from deltackpt.cli.reference import render
from deltackpt.errors import StoreError, UnknownVersionError
from tests.conftest import run_cli


def _one_line_error(proc, *needles: str) -> str:
    assert proc.returncode == cli.EXIT_ERROR, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deltackpt: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def ckpt(tmp_path):
    """A repository of a small Sequential saved with its optimizer, twice, tagged and with a metric."""
    path = str(tmp_path / "ckpt")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    for step in (1, 2):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path,
                       step=step, metrics={"loss": 1.0 / step}, tag=["warmup", "final"][step - 1])
    return path


@pytest.mark.parametrize("revision,suggestion", [
    ("lastest", "'latest'"), ("LATEST", "'latest'"), ("lastest~1", "'latest~1'"), ("head", "'HEAD'"),
    ("warmpu", "'warmup'"), ("fianl~1", "'final~1'"), ("best:los", "'best:loss'"), ("best:los:max", "'best:loss:max'"),
])
def test_a_misspelt_revision_suggests_the_nearest_names(ckpt, revision, suggestion):
    """An unknown revision's error names it and the closest of latest, HEAD, the tags and
    best:METRIC, spelt as the revision was (its ~N, its :max)."""
    with pytest.raises(UnknownVersionError) as info:
        deltackpt.Repo(ckpt).resolve(revision)
    assert str(info.value).endswith(f"; did you mean {suggestion}?"), str(info.value)
    assert repr(revision.split("~")[0].removeprefix("best:").removesuffix(":max")) in str(info.value)


def test_show_of_a_misspelt_revision_is_one_line_with_a_guess(ckpt):
    """The command prints the suggestion in its one line (and --json in its message); a revision
    close to nothing gets no guess."""
    line = _one_line_error(run_cli("show", "lastest", "--repo", ckpt, check=False), "'lastest'",
                           "did you mean 'latest'?")
    proc = run_cli("show", "lastest", "--repo", ckpt, "--json", check=False)
    assert json.loads(proc.stdout)["error"]["message"] == line.removeprefix("deltackpt: error: ")
    assert "did you mean" not in _one_line_error(run_cli("show", "zzzzzz", "--repo", ckpt, check=False), "'zzzzzz'")


PROC_REASONS = ("No such file or directory", "Permission denied")


@pytest.mark.parametrize("where,command", [("proc", "init"), ("proc-parent", "init"), ("under-a-file", "init"),
                                           ("read-only", "init"), ("proc", "import")])
def test_a_write_where_no_folder_can_be_made_names_the_path_and_the_reason(tmp_path, command, where):
    """init (or import) at a path whose folder cannot be created exits 3 with one line naming that
    path and the OS's reason, never "no such object"; --json says the same."""
    if where == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    # /proc takes no new folder from anyone: root is told ENOENT, another user EACCES
    path, reasons = {
        "proc": ("/proc/deltackpt-test", PROC_REASONS),
        "proc-parent": ("/proc/deltackpt-test/a/ckpt", PROC_REASONS),
        "under-a-file": (str(tmp_path / "file" / "ckpt"), ("Not a directory",)),
        "read-only": (str(tmp_path / "ro" / "ckpt"), ("Permission denied",)),
    }[where]
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "ro").mkdir(mode=0o555)
    weights = str(tmp_path / "w.safetensors")
    from safetensors.torch import save_file
    save_file({"w": torch.ones(2)}, weights)
    argv = ["init", "--keyframe-interval", "4"] if command == "init" else ["import", weights]
    line = _one_line_error(run_cli(*argv, "--repo", path, check=False))
    assert any(r in line for r in reasons) and "no such object" not in line, line
    assert any(p in line for p in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path)))), line
    proc = run_cli(*argv, "--repo", path, "--json", check=False)
    assert json.loads(proc.stdout)["error"]["type"] == "StoreError"
    assert not os.path.exists(path)


def test_a_save_where_no_folder_can_be_made_names_the_path(tmp_path):
    """deltackpt.save raises StoreError naming the path and the reason, with its errno."""
    with pytest.raises(StoreError, match=f"/proc/deltackpt-test: ({'|'.join(PROC_REASONS)})") as info:
        deltackpt.save({"w": torch.ones(2)}, "/proc/deltackpt-test")
    assert info.value.errno in (errno.ENOENT, errno.EACCES) and "[Errno" not in str(info.value)


def test_show_layer_lists_only_that_module(ckpt):
    """show --layer 2 lists model.2's tensors and nothing else, in text and --json; a layer the
    version lacks is one line with the names it has."""
    text = run_cli("show", "--layer", "2", "--repo", ckpt).stdout
    rows = [line.split()[0] for line in text.splitlines() if line.startswith("model.")]
    assert rows == ["model.2.weight", "model.2.bias"], text
    assert "tensors 2 under 2," in text
    info = json.loads(run_cli("show", "latest", "--layer", "2", "--layer", "model.0", "--json", "--repo", ckpt).stdout)
    assert [t["name"] for t in info["tensors"]] == ["model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"]
    everything = json.loads(run_cli("show", "--json", "--repo", ckpt).stdout)
    assert len(everything["tensors"]) > 4   # the optimizer's too, without --layer
    _one_line_error(run_cli("show", "--layer", "3", "--repo", ckpt, check=False), "'3' selects no tensor", "model")


def test_every_column_the_commands_print_is_documented(ckpt, capsys):
    """Each header of log, show, du, diff and events (and each header line of show) has its row in
    docs/cli.md, under that command's section.  (The commands run in this process: what they print
    is the point here, not how they fail.)"""
    deltackpt.Repo(ckpt).drill("latest")   # an event to list

    def printed(*argv: str) -> str:
        assert cli.main([*argv, "--repo", ckpt]) == 0
        return capsys.readouterr().out

    page = render()
    headers = {
        "log": printed("log").splitlines()[0],
        "show": printed("show"),
        "du": printed("du").splitlines()[0],
        "diff": printed("diff", "latest~1").splitlines()[0],
        "events": printed("events").splitlines()[0],
    }
    for command, out in headers.items():
        section = page.split(f"## `deltackpt {command}`")[1].split("\n## ")[0]
        documented = set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))
        if command == "show":
            header_lines = {line.split()[0] for line in out.split("\n\n")[0].splitlines()}
            table_header = out.split("\n\n")[1].splitlines()[0]
            assert header_lines <= documented, header_lines - documented
            out = table_header
        names = [c for c in re.split(r"\s{2,}", out.strip())]
        assert names == list(dict(columns.TABLES[command][-1][1])), (command, names)
        assert set(names) <= documented, (command, set(names) - documented)
    assert "`exact`" in page.split("## `deltackpt log`")[1].split("\n## ")[0]


def test_load_of_a_layer_returns_only_the_selected_subtrees(ckpt):
    """load(layers=["model"]) returns the model's tensors and nothing of the optimizer (not its
    param_groups, not its empty containers) nor the plain values beside them; a layer inside the
    optimizer brings its plain values with it."""
    state = deltackpt.load(ckpt, layers=["model"])
    assert list(state) == ["model"]
    assert list(state["model"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    head = deltackpt.load(ckpt, layers=["2"])
    assert head == {"model": {"2.weight": head["model"]["2.weight"], "2.bias": head["model"]["2.bias"]}}
    opt = deltackpt.load(ckpt, layers=["optimizer"])
    full = deltackpt.load(ckpt)
    assert list(opt) == ["optimizer"] and opt["optimizer"]["param_groups"] == full["optimizer"]["param_groups"]
    assert all(torch.equal(opt["optimizer"]["state"][0][k], full["optimizer"]["state"][0][k])
               for k in ("exp_avg", "exp_avg_sq"))
