"""Dedup, partial writes and layer reads, measured on the store's real traffic."""

from __future__ import annotations

import torch

import deltackpt
from deltackpt.store import CountingStore, LocalStore
from tests.strategies import assert_bit_identical


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "encoder": torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)),
        "decoder": torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)),
        "encoder2": torch.nn.Linear(64, 64),
    })


def test_saving_the_same_state_twice_writes_only_a_manifest(repo_path):
    """A second identical save adds no chunk: only the manifest's bytes are written."""
    m = _model()
    deltackpt.save(m, repo_path)
    counting = CountingStore(LocalStore(repo_path))
    v2 = deltackpt.save(m, deltackpt.Repo(counting))
    assert v2.written_bytes == 0
    written_keys = {k.split("/")[0] for k in counting.inner.list("") if "manifests" in k}
    assert written_keys == {"manifests"}
    assert counting.bytes_written < 20_000  # manifest + ref + lock, no pack
    assert not any(k.startswith("packs/") for k in counting.keys_read)


def test_changing_one_tensor_writes_only_its_chunks(repo_path):
    """When one tensor changes, the new version writes only that tensor's chunks."""
    m = _model()
    deltackpt.save(m, repo_path)
    with torch.no_grad():
        m["decoder"][1].weight.add_(1.0)
    repo = deltackpt.Repo(repo_path)
    v = deltackpt.save(m, repo)
    shown = repo.show(v)
    assert shown["written"]["chunks_new"] == 1
    assert 0 < v.written_bytes <= 256 * 256 * 4 * 1.01


def test_layer_load_reads_only_that_layers_chunks(repo_path):
    """load(layers=['encoder']) reads the encoder's pack bytes and nothing of other layers."""
    m = _model()
    deltackpt.save({"model": m.state_dict(), "step": 1}, repo_path)
    counting = CountingStore(LocalStore(repo_path))
    repo = deltackpt.Repo(counting)
    manifest = repo.core.manifest(repo.core.resolve("latest"))
    enc = [t for t in manifest.tensors if t.name.startswith("model.encoder.")]
    expected = repo.core.index.stored_size(c.chunk_id for t in enc for c in manifest.blobs[t.blob].chunks)
    counting.reset()
    out = deltackpt.load(repo, layers=["encoder"])
    pack_bytes = sum(1 for k in counting.keys_read if k.startswith("packs/"))
    assert set(out["model"]) == {"encoder.0.weight", "encoder.0.bias", "encoder.1.weight", "encoder.1.bias"}
    assert 1 <= pack_bytes <= len(enc)  # at most one ranged read per chunk (adjacent ones are merged)
    pack_read = counting.bytes_read - sum(len(counting.inner.get(k)) for k in set(counting.keys_read)
                                          if not k.startswith("packs/"))
    assert pack_read <= expected + 64
    assert set(out) == {"model"}   # only the selected subtree: the plain "step" beside it is left out


def test_layer_selection_respects_dot_boundaries(repo_path):
    """'encoder' selects encoder.* but not encoder2.*."""
    deltackpt.save(_model(), repo_path)
    out = deltackpt.load(repo_path, layers="encoder")
    assert out and all(k.startswith("encoder.") for k in out)


def test_restore_writes_in_place_and_leaves_other_layers_untouched(repo_path):
    """restore(layers=...) writes into the existing parameters' memory and touches nothing else."""
    m = _model()
    deltackpt.save(m, repo_path)
    saved = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    ptrs = {k: v.data_ptr() for k, v in m.state_dict().items()}
    deltackpt.restore(m, repo_path, layers=["encoder"])
    for k, v in m.state_dict().items():
        assert v.data_ptr() == ptrs[k]
        if k.startswith("encoder."):
            assert torch.equal(v, saved[k])
        else:
            assert not v.any()


def test_restore_into_model_and_optimizer_matches_saved(repo_path):
    """restore(model, optimizer=...) reproduces the saved parameters and optimizer state exactly."""
    m = _model()
    opt = torch.optim.AdamW(m.parameters())
    m["encoder"][0](torch.randn(2, 256)).sum().backward()
    opt.step()
    deltackpt.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, repo_path)
    m2 = _model()
    opt2 = torch.optim.AdamW(m2.parameters())
    deltackpt.restore(m2, repo_path, optimizer=opt2)
    assert_bit_identical(dict(m.state_dict()), dict(m2.state_dict()))
    assert_bit_identical(opt.state_dict()["state"], opt2.state_dict()["state"])


def test_restore_strict_mismatch_is_a_typed_error(repo_path):
    """Restoring into a model with other shapes or keys raises StateMismatchError naming the tensor."""
    deltackpt.save(torch.nn.Linear(4, 4), repo_path)
    try:
        deltackpt.restore(torch.nn.Linear(4, 5), repo_path)
    except deltackpt.StateMismatchError as exc:
        assert "weight" in str(exc)
    else:
        raise AssertionError("no error")
    try:
        deltackpt.restore(torch.nn.Sequential(torch.nn.Linear(4, 4)), repo_path)
    except deltackpt.StateMismatchError as exc:
        assert "missing" in str(exc)
    else:
        raise AssertionError("no error")


def test_distinct_store_objects_get_distinct_handles():
    """Two MemoryStore repositories never share a handle (or its index and delta cache)."""
    from deltackpt.store import MemoryStore
    a, b = deltackpt.Repo(MemoryStore(), create=True), deltackpt.Repo(MemoryStore(), create=True)
    deltackpt.save({"x": torch.ones(4)}, a)
    assert a.core is not b.core and b.log() == []
    v = deltackpt.save({"x": torch.ones(4)}, b)
    assert v.written_bytes > 0
