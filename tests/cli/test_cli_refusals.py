"""Issue 23, items 9, 11 and 13, through the real ``deltackpt`` command (subprocesses): inputs that
reached exit 4 (an internal error) or did nothing while exiting 0 now get one typed line, or a
figure, before anything is written."""

from __future__ import annotations

import json
import os

import pytest
import torch

import deltackpt
from deltackpt.cli import main as cli
from tests.cli.test_cli_errors import _one_line_error
from tests.conftest import file_digests, run_cli


# item 11: diff of stride-0 views ------------------------------------------------------------------
def test_diff_of_stride0_views_of_2_to_the_36_elements_compares_without_expanding(tmp_path):
    """A stride-0 view of 2^36 float32 elements (256 GiB expanded) diffs as one element: exit 0 and
    the right figures; two views broadcast along different dimensions (2^36 real comparisons) are
    reported as not compared, with the reason, instead of exiting 4."""
    repo = str(tmp_path / "r")
    n = 1 << 36
    deltackpt.save({"w": torch.zeros(1).expand(n), "m": torch.zeros(1 << 18, 1).expand(1 << 18, 1 << 18),
                    "same": torch.full((1,), 2.0).expand(n)}, repo)
    deltackpt.save({"w": torch.full((1,), 0.5).expand(n), "m": torch.ones(1, 1 << 18).expand(1 << 18, 1 << 18),
                    "same": torch.full((1,), 2.0).expand(n)}, repo)
    proc = run_cli("diff", "latest~1", "latest", "--repo", repo, "--json", check=False)
    assert proc.returncode == cli.EXIT_OK, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert (rows["w"]["changed_fraction"], rows["w"]["max_abs"], rows["w"]["rel_l2"]) == (1.0, 0.5, float("inf"))
    assert rows["same"]["changed_fraction"] == 0.0
    assert rows["m"]["changed_fraction"] is None and rows["m"]["note"].startswith("not compared")
    text = run_cli("diff", "latest~1", "latest", "--repo", repo).stdout
    assert "not compared" in text and "100.0%" in text


def test_diff_figures_of_an_ordinary_tensor_are_unchanged_by_piecewise_comparison(tmp_path):
    """A tensor larger than one comparison piece (2^22 elements) gives the figures computed whole."""
    repo = str(tmp_path / "r")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3000, 2000, generator=g)
    b = a.clone()
    b[::7] += 0.25
    b[5, 5] = float("nan")
    deltackpt.save({"t": a}, repo)
    deltackpt.save({"t": b}, repo)
    row = deltackpt.Repo(repo).diff("latest~1", "latest")[0]
    d = (b.double() - a.double()).abs()
    fin = d[torch.isfinite(d)]
    assert row["changed_fraction"] == pytest.approx(((a != b) | b.isnan()).double().mean().item())
    assert row["max_abs"] == pytest.approx(fin.max().item())
    assert row["rel_l2"] == pytest.approx(fin.pow(2).sum().sqrt().item() / a.double().norm().item())


# item 11: dtypes safetensors cannot hold ---------------------------------------------------------
UNHELD = {"complex128": lambda: torch.randn(3, dtype=torch.complex128),
          "complex32": lambda: torch.randn(3, dtype=torch.complex64).to(torch.complex32),
          "bits8": lambda: torch.arange(4, dtype=torch.uint8).view(torch.bits8)}


def test_restore_to_safetensors_of_a_dtype_it_cannot_hold_is_one_line_and_writes_nothing(tmp_path):
    """restore -o x.safetensors of a complex128 / complex32 / bits8 tensor (exit 4 before: safetensors'
    KeyError) exits 3 naming the tensor and its dtype, leaves an existing file as it was and no
    temporary beside it; .pt holds all three bit for bit."""
    repo = str(tmp_path / "r")
    state = {"ok": torch.ones(2), **{name: make() for name, make in UNHELD.items()}}
    deltackpt.save(state, repo)
    out = tmp_path / "x.safetensors"
    out.write_bytes(b"the user's earlier file")
    for dtype in sorted(UNHELD):
        proc = run_cli("restore", "latest", "--repo", repo, "-o", str(out), "--layer", "ok", "--layer", dtype,
                       "--json", check=False)
        _one_line_error(proc, cli.EXIT_ERROR, str(out), f"tensor {dtype} is {dtype}", "safetensors cannot hold", ".pt")
        assert json.loads(proc.stdout)["error"]["type"] == "UnsupportedLeafError"
        assert out.read_bytes() == b"the user's earlier file"
        assert sorted(os.listdir(tmp_path)) == ["r", "x.safetensors"]
    pt = str(tmp_path / "x.pt")
    run_cli("restore", "latest", "--repo", repo, "-o", pt)
    back = torch.load(pt, weights_only=True)
    for name, t in state.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name].view(torch.uint8), t.view(torch.uint8)), name


# item 9: settings no config can hold -------------------------------------------------------------
@pytest.mark.parametrize("option", [("--chunk-bytes", "-1"), ("--chunk-bytes", "0"), ("--chunk-bytes", str(1 << 40)),
                                    ("--keyframe-interval", "5000"), ("--keyframe-interval", "-1")],
                         ids=lambda o: " ".join(o))
def test_init_with_a_setting_no_config_can_hold_is_a_usage_error_and_creates_nothing(tmp_path, option):
    """init --chunk-bytes -1 (or 0, 2^40; --keyframe-interval 5000 or -1) exits 2 with one line naming
    the option and its range, and creates no folder; it used to write a config no command could read."""
    repo = str(tmp_path / "r")
    proc = run_cli("init", "--repo", repo, *option, check=False)
    _one_line_error(proc, cli.EXIT_USAGE, option[0], option[1])
    assert not os.path.exists(repo)


# item 13: init of an existing repository -----------------------------------------------------------
def test_init_of_an_existing_repository_says_so_and_changes_nothing(tmp_path):
    """A second init exits 0 saying the repository already exists (--json: "created": false) and
    writes nothing; an option asking for another setting than the repository has exits 3 naming it."""
    repo = str(tmp_path / "r")
    assert json.loads(run_cli("init", "--repo", repo, "--json").stdout)["created"] is True
    deltackpt.save({"w": torch.ones(3)}, repo)
    before = file_digests(repo)
    again = run_cli("init", "--repo", repo)
    assert "already exists" in again.stdout and "nothing changed" in again.stdout
    assert "initialized" not in again.stdout
    assert json.loads(run_cli("init", "--repo", repo, "--json").stdout)["created"] is False
    assert run_cli("init", "--repo", repo, "--keyframe-interval", "8", "--delta-base", "child").returncode == 0
    proc = run_cli("init", "--repo", repo, "--chunk-bytes", "4096", check=False)
    _one_line_error(proc, cli.EXIT_ERROR, "already exists", "chunk_bytes 2097152", "4096")
    assert file_digests(repo) == before


# item 13: silent no-ops -----------------------------------------------------------------------------
@pytest.fixture
def model_repo(tmp_path):
    repo = str(tmp_path / "r")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for step in range(3):
        deltackpt.save({"model": model.state_dict(), "step": step}, repo, step=step, metrics={"loss": 1.0 / (step + 1)})
    return repo


@pytest.mark.parametrize("layers,needles", [
    (["nope"], ["layer 'nope' selects no tensor", "top-level layers: model"]),
    (["model.0", "modl.1"], ["layer 'modl.1'", "did you mean 'model.1'"]),
], ids=["unknown", "one-typo-among-two"])
def test_restore_of_a_layer_the_version_lacks_fails_before_writing(model_repo, tmp_path, layers, needles):
    """restore --layer nope used to write an empty .pt and exit 0: now exit 3, one line naming the
    layer and the layers there are, and no file (an existing one is left as it was)."""
    out = tmp_path / "x.pt"
    args = [a for layer in layers for a in ("--layer", layer)]
    proc = run_cli("restore", "latest", "--repo", model_repo, "-o", str(out), *args, "--json", check=False)
    _one_line_error(proc, cli.EXIT_ERROR, *needles)
    assert json.loads(proc.stdout)["error"]["type"] == "StateMismatchError"
    assert not out.exists()


def test_load_of_a_layer_the_version_lacks_raises(model_repo):
    with pytest.raises(deltackpt.errors.StateMismatchError, match="layer 'decoder' selects no tensor"):
        deltackpt.load(model_repo, layers=["decoder"])


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_gc_keep_best_on_a_metric_no_version_records_is_refused(model_repo, dry):
    """gc --keep-best val_loss:2 on a repository recording only 'loss' used to keep nothing for that
    rule and remove the rest silently: now one line naming the metric and those recorded (--json
    carries it), and nothing is removed."""
    before = file_digests(model_repo)
    proc = run_cli("gc", "--repo", model_repo, "--keep-last", "1", "--keep-best", "val_loss:2", "--grace", "0",
                   "--json", *(["--dry-run"] if dry else []), check=False)
    _one_line_error(proc, cli.EXIT_USAGE, "'val_loss'", "metrics recorded: loss", "nothing was removed")
    assert json.loads(proc.stdout)["error"]["type"] == "InvalidArgumentError"
    assert file_digests(model_repo) == before
    kept = json.loads(run_cli("gc", "--repo", model_repo, "--keep-last", "1", "--keep-best", "loss:1:max",
                              "--json", "--dry-run").stdout)["kept"]
    assert len(kept) == 2   # latest, and the best by a metric that is recorded


def test_a_checkpointer_whose_metric_is_not_recorded_yet_keeps_training(repo_path):
    """The Checkpointer's own gc does not refuse: its first versions may precede the first evaluation."""
    ckpt = deltackpt.Checkpointer(repo_path, retention=deltackpt.Retention(keep_last=1, keep_best=("val", 1, "min")),
                                  blocking=True, grace_seconds=0)
    model = torch.nn.Linear(2, 2)
    for step in range(3):
        ckpt.step({"model": model.state_dict()}, step=step, force=True)
    ckpt.close()
    assert len(deltackpt.Repo(repo_path).log()) == 1
