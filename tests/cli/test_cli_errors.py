"""Every failure of the real ``deltackpt`` command (a subprocess) is one stderr line naming the
object, with a documented exit status distinct from "verify found problems" (issue 16, item 14)."""

from __future__ import annotations

import json
import os

import msgpack
import pytest
import torch

import deltackpt
from deltackpt.cli import main as cli
from deltackpt.format import manifest as manifest_fmt
from deltackpt.format.ids import hex_id
from tests.conftest import ROOT, run_cli


def _one_line_error(proc, code: int, *needles: str) -> str:
    """Assert the exit status, a single `deltackpt: error:` line on stderr and no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deltackpt: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def repo(tmp_path):
    path = str(tmp_path / "r")
    deltackpt.save({"w": torch.randn(4, 4), "b": torch.zeros(4)}, path, step=1)
    return path


@pytest.mark.parametrize("ext", [".pt", ".safetensors"])
def test_restore_into_a_missing_folder_is_one_line(repo, tmp_path, ext):
    """restore -o into a folder that does not exist exits 3 with one line naming the path; nothing is created."""
    out = str(tmp_path / "missing" / f"x{ext}")
    proc = run_cli("restore", "--repo", repo, "-o", out, check=False)
    _one_line_error(proc, cli.EXIT_ERROR, out, "does not exist")
    assert not os.path.exists(os.path.dirname(out))


def test_restore_onto_a_folder_is_one_line(repo, tmp_path):
    """restore -o naming an existing folder (with a .pt name) exits 3 with one line naming it."""
    out = tmp_path / "out.pt"
    out.mkdir()
    _one_line_error(run_cli("restore", "--repo", repo, "-o", str(out), check=False), cli.EXIT_ERROR,
                    str(out), "is a folder")


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"\xff" * 8 + b"{}",
                                     b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}"])
def test_import_of_a_corrupt_safetensors_file_is_one_line(tmp_path, content):
    """import of a corrupt .safetensors exits 3 naming the file (--json: ForeignFileError); no repository is created."""
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(content)
    path = str(tmp_path / "r")
    proc = run_cli("import", str(bad), "--repo", path, "--json", check=False)
    _one_line_error(proc, cli.EXIT_ERROR, str(bad), "not a valid .safetensors file")
    assert json.loads(proc.stdout)["error"]["type"] == "ForeignFileError"
    assert not os.path.exists(path)


@pytest.mark.parametrize("name", ["weights", "weights.safetensors", "weights.pt"])
def test_import_of_a_folder_is_one_line(tmp_path, name):
    """import of a directory (whatever its extension) exits 3 naming it."""
    folder = tmp_path / name
    folder.mkdir()
    _one_line_error(run_cli("import", str(folder), "--repo", str(tmp_path / "r"), check=False), cli.EXIT_ERROR,
                    str(folder), "is a folder")


def test_import_of_a_fifo_does_not_block(tmp_path):
    """import of a named pipe exits 3 at once ("not a regular file") instead of waiting for a writer."""
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    _one_line_error(run_cli("import", str(fifo), "--repo", str(tmp_path / "r"), check=False), cli.EXIT_ERROR,
                    str(fifo), "not a regular file")


def test_import_of_a_missing_or_corrupt_pt_file_is_one_line(tmp_path):
    """import of a missing file or a corrupt .pt exits 3 naming the file."""
    missing = str(tmp_path / "nothere.pt")
    _one_line_error(run_cli("import", missing, "--repo", str(tmp_path / "r"), check=False), cli.EXIT_ERROR,
                    missing, "No such file")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    _one_line_error(run_cli("import", str(bad), "--repo", str(tmp_path / "r"), check=False), cli.EXIT_ERROR,
                    str(bad), "cannot import")


def _stride0_version(repo: str) -> str:
    """A version whose tensor ``w`` is a stride-0 view of 2^40 elements over one stored float (what
    ``torch.zeros(1).expand(2**40)`` means), crafted as a manifest since saving one copies it."""
    with open(os.path.join(repo, "refs", "latest")) as f:
        vid = f.read().strip()
    with open(os.path.join(repo, "manifests", vid), "rb") as f:
        body = msgpack.unpackb(f.read()[len(manifest_fmt.MAGIC):], raw=False, strict_map_key=False)
    t = next(t for t in body["tensors"] if t["name"] == "w")
    t.update(shape=[1 << 40], stride=[0])
    data = manifest_fmt.MAGIC + msgpack.packb(body, use_bin_type=True)
    new = hex_id(data)
    with open(os.path.join(repo, "manifests", new), "wb") as f:
        f.write(data)
    return new


def test_export_of_a_huge_stride0_view_to_safetensors_is_refused_before_allocating(repo, tmp_path):
    """restore to .safetensors of a stride-0 view of 2^40 float32 elements (4 TiB materialized) exits 3
    with OutOfMemoryError naming the tensor, before allocating, and leaves no file; .pt keeps the view."""
    vid = _stride0_version(repo)
    out = str(tmp_path / "big.safetensors")
    proc = run_cli("restore", vid, "--repo", repo, "-o", out, "--json", check=False)
    _one_line_error(proc, cli.EXIT_ERROR, out, "tensor w", str(4 << 40))
    assert json.loads(proc.stdout)["error"]["type"] == "OutOfMemoryError"
    assert not os.path.exists(out)
    small = str(tmp_path / "big.pt")
    run_cli("restore", vid, "--repo", repo, "-o", small)
    w = torch.load(small, weights_only=True)["w"]
    assert w.shape == (1 << 40,) and w.stride() == (0,) and os.path.getsize(small) < 1 << 20


def test_a_missing_optional_dependency_is_one_line(repo, tmp_path):
    """When safetensors cannot be imported, restore to .safetensors exits 3 with one line naming the module."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "safetensors.py").write_text("raise ModuleNotFoundError(\"No module named 'safetensors'\", "
                                           "name='safetensors')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shadow), ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = run_cli("restore", "--repo", repo, "-o", str(tmp_path / "x.safetensors"), check=False, env=env)
    _one_line_error(proc, cli.EXIT_ERROR, "missing dependency", "safetensors")


def test_unknown_revision_and_missing_repository_exit_3_not_1(repo, tmp_path):
    """Errors exit 3 (not verify's 1, not argparse's 2) with one line; DELTACKPT_DEBUG=1 adds the traceback."""
    _one_line_error(run_cli("show", "nosuchtag", "--repo", repo, check=False), cli.EXIT_ERROR, "nosuchtag")
    _one_line_error(run_cli("verify", "--repo", str(tmp_path / "none"), check=False), cli.EXIT_ERROR,
                    "not a deltackpt repository")
    assert run_cli("log", "--repo", repo, "--no-such-option", check=False).returncode == cli.EXIT_USAGE
    debug = run_cli("show", "nosuchtag", "--repo", repo, check=False, env={"DELTACKPT_DEBUG": "1"})
    assert debug.returncode == cli.EXIT_ERROR and "Traceback" in debug.stderr


def test_exit_codes_are_documented_in_help():
    """`deltackpt --help` lists every exit status the command uses."""
    text = run_cli("--help").stdout
    for code in (cli.EXIT_OK, cli.EXIT_PROBLEMS, cli.EXIT_USAGE, cli.EXIT_ERROR, cli.EXIT_BUG, cli.EXIT_INTERRUPTED):
        assert f"\n  {code} " in text


def test_an_unexpected_exception_maps_to_the_internal_error_status():
    """An exception that is no DeltackptError, OSError, ImportError or MemoryError is a bug: exit 4, one
    line with the DELTACKPT_DEBUG hint; the typed ones are 3."""
    text, code = cli._message(ZeroDivisionError("division by zero"))
    assert code == cli.EXIT_BUG and "DELTACKPT_DEBUG=1" in text
    assert cli._message(PermissionError(13, "Permission denied", "/x/y"))[0] == "/x/y: Permission denied"
    assert cli._message(ModuleNotFoundError("No module named 'zstandard'", name="zstandard"))[1] == cli.EXIT_ERROR
    assert cli._one_line("a\nb\n  c") == "a b c"


def test_a_repository_path_that_is_a_file_is_named(tmp_path):
    """--repo naming a plain file exits 3 with one line naming that path (not only the key 'config')."""
    path = tmp_path / "afile"
    path.write_text("x")
    for command in ("log", "init", "verify"):
        _one_line_error(run_cli(command, "--repo", str(path), check=False), cli.EXIT_ERROR, str(path))
