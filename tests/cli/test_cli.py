"""The deltackpt command, run for real in subprocesses."""

from __future__ import annotations

import json
import os

import torch

import deltackpt
from tests.conftest import run_cli


def _repo_with_versions(path: str, n: int = 3) -> list:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
    out = []
    for i in range(n):
        with torch.no_grad():
            model[1].weight.add_(0.01)
        out.append(deltackpt.save({"model": model.state_dict(), "step": i}, path, step=i, metrics={"loss": 1.0 / (i + 1)}))
    return out


def test_init_log_show_du_json(tmp_path):
    """init creates a repository; log, show and du answer in parseable JSON."""
    path = str(tmp_path / "r")
    assert json.loads(run_cli("init", "--repo", path, "--json").stdout)["format_version"] == 3
    versions = _repo_with_versions(path)
    log = json.loads(run_cli("log", "--repo", path, "--json").stdout)
    assert [v["id"] for v in log] == [v.id for v in reversed(versions)]
    show = json.loads(run_cli("show", "latest", "--repo", path, "--json").stdout)
    assert {t["name"] for t in show["tensors"]} >= {"model.0.weight", "model.1.bias"}
    du = json.loads(run_cli("du", "--repo", path, "--json").stdout)
    assert du["total"]["versions"] == 3 and du["total"]["stored_bytes"] > 0
    text = run_cli("log", "--repo", path).stdout
    assert versions[0].short_id in text and "loss=" in text


def test_init_delta_base_keyframe_is_stored_in_the_config(tmp_path):
    """init --delta-base keyframe records the star choice in the config, so later saves by any
    handle take lossless deltas against keyframes (depth <= 1)."""
    path = str(tmp_path / "r")
    run_cli("init", "--repo", path, "--delta-base", "keyframe")
    _repo_with_versions(path, 4)
    repo = deltackpt.Repo(path)
    assert repo.core.config.delta_base == "keyframe"
    assert max(e.depth for _c, _p, e in repo.core.index.items()) == 1


def test_restore_layer_to_pt_and_safetensors(tmp_path):
    """restore --layer writes only that layer, to .pt or .safetensors by extension."""
    from safetensors.torch import load_file
    path = str(tmp_path / "r")
    _repo_with_versions(path)
    out_st = str(tmp_path / "l.safetensors")
    info = json.loads(run_cli("restore", "latest~1", "--layer", "0", "-o", out_st, "--repo", path, "--json").stdout)
    assert info["tensors"] == 2
    loaded = load_file(out_st)
    expected = deltackpt.load(path, "latest~1", layers=["0"])["model"]
    assert set(loaded) == {"model.0.weight", "model.0.bias"}
    assert torch.equal(loaded["model.0.weight"], expected["0.weight"])
    out_pt = str(tmp_path / "all.pt")
    run_cli("restore", "--repo", path, "-o", out_pt)
    assert torch.equal(torch.load(out_pt, weights_only=True)["model"]["1.weight"],
                       deltackpt.load(path)["model"]["1.weight"])


def test_tag_gc_verify_and_diff(tmp_path):
    """tag, gc --dry-run/--keep-last, verify and diff do what they say, with --json."""
    path = str(tmp_path / "r")
    versions = _repo_with_versions(path, 4)
    run_cli("tag", "first", versions[0].id[:8], "--repo", path)
    dry = json.loads(run_cli("gc", "--keep-last", "1", "--dry-run", "--repo", path, "--json").stdout)
    assert sorted(dry["removed"]) == sorted(v.id for v in versions[1:3])
    assert len(json.loads(run_cli("log", "--repo", path, "--json").stdout)) == 4
    real = json.loads(run_cli("gc", "--keep-last", "1", "--grace", "0", "--repo", path, "--json").stdout)
    assert real["removed"] == dry["removed"]
    assert json.loads(run_cli("verify", "--repo", path, "--json").stdout)["ok"] is True
    diff = json.loads(run_cli("diff", "first", "latest", "--repo", path, "--json").stdout)
    row = {r["name"]: r for r in diff}
    assert row["model.1.weight"]["changed_fraction"] == 1.0 and row["model.0.weight"]["changed_fraction"] == 0.0


def test_import_pt_and_safetensors(tmp_path):
    """import stores a .pt (weights-only loader) or .safetensors file as a version."""
    from safetensors.torch import save_file
    path = str(tmp_path / "r")
    state = {"a": torch.randn(5, 5), "b": torch.arange(3)}
    torch.save(state, tmp_path / "s.pt")
    save_file(state, str(tmp_path / "s.safetensors"))
    v1 = json.loads(run_cli("import", str(tmp_path / "s.pt"), "--repo", path, "--json").stdout)
    v2 = json.loads(run_cli("import", str(tmp_path / "s.safetensors"), "--repo", path, "--json", "--tag", "st").stdout)
    assert torch.equal(deltackpt.load(path, v1["id"])["a"], state["a"])
    assert torch.equal(deltackpt.load(path, "st")["b"], state["b"])


def test_errors_exit_3_with_a_message_naming_the_problem(tmp_path):
    """A bad revision or a missing repository exits 3 and names what is wrong; --json carries the type."""
    path = str(tmp_path / "r")
    proc = run_cli("log", "--repo", path, check=False)
    assert proc.returncode == 3 and "not a deltackpt repository" in proc.stderr
    _repo_with_versions(path, 1)
    proc = run_cli("show", "nosuchtag", "--repo", path, "--json", check=False)
    assert proc.returncode == 3 and json.loads(proc.stdout)["error"]["type"] == "UnknownVersionError"


def test_verify_exits_1_and_names_the_bad_version(tmp_path):
    """verify on a damaged repository exits 1 and lists the affected version."""
    path = str(tmp_path / "r")
    versions = _repo_with_versions(path, 1)
    packs = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(path, "packs")) for f in fs]
    with open(packs[0], "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff")
    proc = run_cli("verify", "--repo", path, check=False)
    assert proc.returncode == 1 and versions[0].short_id in proc.stdout


def test_long_operations_print_no_progress_when_not_a_tty(tmp_path):
    """With stdout/stderr piped, a large import and verify print no progress bar escape codes."""
    path = str(tmp_path / "r")
    big = {"w": torch.randn(4096, 4200)}  # ~69 MB, above the progress threshold
    torch.save(big, tmp_path / "big.pt")
    proc = run_cli("import", str(tmp_path / "big.pt"), "--repo", path)
    proc2 = run_cli("verify", "--repo", path)
    for p in (proc, proc2):
        assert "\x1b[" not in p.stderr and "\x1b[" not in p.stdout


def test_rebuild_index_restores_a_repository_whose_index_was_deleted(tmp_path):
    """After every index file is deleted, `deltackpt rebuild-index` makes verify pass and versions load."""
    import shutil
    path = str(tmp_path / "r")
    versions = _repo_with_versions(path, 2)
    shutil.rmtree(os.path.join(path, "index"))
    assert run_cli("verify", "--repo", path, check=False).returncode == 1
    info = json.loads(run_cli("rebuild-index", "--repo", path, "--json").stdout)
    assert info["packs_indexed"] >= 1
    assert run_cli("verify", "--repo", path).returncode == 0
    assert deltackpt.load(path, versions[0].id)["step"] == 0
