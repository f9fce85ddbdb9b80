"""`deltackpt import` keeps imports off the training line (issue 23, item 14): `latest` does not move,
so resume continues the run and `gc --keep-last` counts training versions; the import is tagged,
loads bit for bit and survives gc by its tag.  Real `deltackpt` subprocesses throughout."""

from __future__ import annotations

import json

import torch

import deltackpt
from deltackpt.training import training_state
from tests.conftest import run_cli


def _train(path: str, steps: int) -> tuple[torch.nn.Module, list]:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    versions = []
    for step in range(1, steps + 1):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        versions.append(deltackpt.save(training_state(model=model, optimizer=opt, step=step), path, step=step))
    return model, versions


def _weights(tmp_path) -> tuple[str, dict]:
    from safetensors.torch import save_file
    w = {"weight": torch.randn(8, 16), "bias": torch.randn(8)}
    save_file(w, str(tmp_path / "model.safetensors"))
    return str(tmp_path / "model.safetensors"), w


def test_import_does_not_move_latest_and_resume_continues_the_run(tmp_path):
    path = str(tmp_path / "r")
    model, versions = _train(path, 3)
    file, weights = _weights(tmp_path)
    proc = run_cli("import", file, "--repo", path)
    assert "off the training line" in proc.stdout and "tag import-model" in proc.stdout, proc.stdout
    assert f"'latest' still names {versions[-1].id[:10]}" in proc.stdout
    r = deltackpt.Repo(path)
    assert r.resolve("latest").id == versions[-1].id                 # latest did not move to the import
    assert r.resolve("latest~1").id == versions[-2].id               # and history does not run through it
    imported = r.resolve("import-model")
    assert imported.parent is None and imported.id != versions[-1].id
    assert all(torch.equal(deltackpt.load(path, "import-model")[k], t) for k, t in weights.items())
    fresh = torch.nn.Linear(16, 8)
    info = deltackpt.resume(path, model=fresh, optimizer=torch.optim.SGD(fresh.parameters(), lr=0.1))
    assert info.step == 3 and torch.equal(fresh.weight, model.weight)
    nxt = deltackpt.save(training_state(model=model, step=4), path, step=4)
    assert nxt.parent == versions[-1].id                              # the next save continues the line


def test_gc_keep_last_counts_training_versions_and_the_tag_keeps_the_import(tmp_path):
    """gc --keep-last 2 after an import keeps the two newest training versions (the import used to
    take one of the two slots, being `latest`), and the import by its tag."""
    path = str(tmp_path / "r")
    _, versions = _train(path, 4)
    file, weights = _weights(tmp_path)
    run_cli("import", file, "--repo", path)
    run_cli("gc", "--keep-last", "2", "--repo", path)
    kept = {v.id for v in deltackpt.Repo(path).log()}
    assert {versions[-1].id, versions[-2].id} <= kept and versions[-3].id not in kept
    assert torch.equal(deltackpt.load(path, "import-model")["weight"], weights["weight"])


def test_import_into_an_empty_repository_leaves_resume_a_fresh_start(tmp_path):
    """Pretrained weights imported first: resume finds no training state (None: start from step 0),
    instead of taking the weights for one."""
    path = str(tmp_path / "r")
    file, _ = _weights(tmp_path)
    out = json.loads(run_cli("import", file, "--repo", path, "--json").stdout)
    assert out["off_line"] is True and out["latest"] is None and out["tag"] == "import-model"
    assert deltackpt.resume(path, model=torch.nn.Linear(16, 8)) is None


def test_a_second_import_of_the_same_name_gets_the_next_free_tag(tmp_path):
    path = str(tmp_path / "r")
    file, _ = _weights(tmp_path)
    run_cli("import", file, "--repo", path)
    proc = run_cli("import", file, "--repo", path)
    assert "tag import-model-2" in proc.stdout
    proc = run_cli("import", file, "--repo", path, "--tag", "import-model", check=False)
    assert proc.returncode == 3 and "import-model" in proc.stderr and "Traceback" not in proc.stderr
