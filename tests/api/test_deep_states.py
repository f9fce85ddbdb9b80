"""Reading accepts what writing accepts (issue 23 item 7): a state nested as deep as a save allows
(MAX_MSGPACK_DEPTH levels of dicts, lists, tuples or a mix) saves, verifies, loads bit for bit and
goes through the real CLI's show / diff / restore; one level more is refused at save with one typed
line.  Before, 505 dicts saved and verified but load raised RecursionError and the CLI exited 4;
lists and tuples were refused far below the limit."""

from __future__ import annotations

import json
import os

import pytest
import torch

import deltackpt
from deltackpt.cli import main as cli
from deltackpt.errors import UnsupportedLeafError
from deltackpt.format.limits import MAX_MSGPACK_DEPTH
from tests.conftest import run_cli

KINDS = ("dict", "list", "tuple", "mixed")


def _nest(kind: str, depth: int, leaf: torch.Tensor):
    """``leaf`` inside ``depth`` containers (``mixed``: dict, list, tuple in turn), each also holding its level."""
    state = leaf
    for i in range(depth):
        k = kind if kind != "mixed" else KINDS[i % 3]
        state = {"k": state, "level": i} if k == "dict" else [state, i] if k == "list" else (state, i)
    return state


def _unnest(state) -> tuple[int, list[tuple[type, int]], torch.Tensor]:
    """(depth, each level's (container type, level number), the innermost tensor), without recursion."""
    levels = []
    while not isinstance(state, torch.Tensor):
        if isinstance(state, dict):
            levels.append((dict, state["level"]))
            state = state["k"]
        else:
            levels.append((type(state), state[1]))
            state = state[0]
    return len(levels), levels, state


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_as_deep_as_a_save_allows_loads_bit_for_bit(repo_path, kind):
    leaf = torch.tensor([1.5, -0.0, float("nan")])
    state = _nest(kind, MAX_MSGPACK_DEPTH, leaf)
    v = deltackpt.save(state, repo_path)
    assert deltackpt.Repo(repo_path).verify().bad_versions == []
    depth, levels, out = _unnest(deltackpt.load(repo_path, v.id))
    assert (depth, levels) == _unnest(state)[:2]
    assert torch.equal(out.view(torch.int32), leaf.view(torch.int32))


@pytest.mark.parametrize("kind", KINDS)
def test_one_level_deeper_is_refused_at_save_with_one_typed_line(repo_path, kind):
    with pytest.raises(UnsupportedLeafError, match=f"nested deeper than {MAX_MSGPACK_DEPTH} levels"):
        deltackpt.save(_nest(kind, MAX_MSGPACK_DEPTH + 1, torch.ones(2)), repo_path)
    assert not os.path.exists(os.path.join(repo_path, "manifests")) or not os.listdir(os.path.join(repo_path, "manifests"))


def test_the_cli_shows_diffs_and_restores_a_state_as_deep_as_a_save_allows(tmp_path):
    """dicts, lists and tuples in turn, MAX_MSGPACK_DEPTH levels, through real subprocesses."""
    kind = "mixed"
    repo = str(tmp_path / "r")
    deltackpt.save(_nest(kind, MAX_MSGPACK_DEPTH, torch.zeros(4)), repo)
    deltackpt.save(_nest(kind, MAX_MSGPACK_DEPTH, torch.ones(4)), repo)
    show = run_cli("show", "latest", "--repo", repo, "--json")
    assert len(json.loads(show.stdout)["tensors"]) == 1
    rows = json.loads(run_cli("diff", "latest~1", "latest", "--repo", repo, "--json").stdout)
    assert [r["changed_fraction"] for r in rows] == [1.0]
    out = str(tmp_path / "deep.pt")
    proc = run_cli("restore", "latest", "--repo", repo, "-o", out, check=False)
    assert proc.returncode == cli.EXIT_OK, proc.stderr
    depth, _levels, leaf = _unnest(torch.load(out, weights_only=True))
    assert depth == MAX_MSGPACK_DEPTH and torch.equal(leaf, torch.ones(4))


def test_resume_restores_a_deep_extra_state(repo_path):
    """resume() (the training path) rebuilds the tree the same way as load."""
    model = torch.nn.Linear(2, 2)
    deltackpt.save({"model": model.state_dict(), "extra": _nest("mixed", MAX_MSGPACK_DEPTH - 1, torch.ones(1))},
                   repo_path)
    info = deltackpt.resume(repo_path, model=torch.nn.Linear(2, 2))
    assert info is not None
    state = deltackpt.load(repo_path, layers=["extra"])
    assert _unnest(state["extra"])[0] == MAX_MSGPACK_DEPTH - 1
