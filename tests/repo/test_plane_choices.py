"""A keyframe takes the byte-plane choices of the position's last keyframe (bytegroup.py,
``compress_planes_choosing``): which planes to compress, and with which parameters, were sampled
on two 16 KiB trials per plane at every save, 8% of a dense save's CPU, for choices that barely
move from one save to the next."""

from __future__ import annotations

import numpy as np
import torch

import deltackpt
from deltackpt.codecs import bytegroup
from deltackpt.repo.write.head import REJUDGE_EVERY


def _counting_trials(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = bytegroup._choose

    def counted(sample, level):
        calls.append(len(sample))
        return real(sample, level)
    monkeypatch.setattr(bytegroup, "_choose", counted)
    return calls


def test_a_dense_position_samples_its_planes_again_only_now_and_then(tmp_path, monkeypatch):
    """Sixteen 256 KiB chunks of fp32 weights that all change at every save: the first save
    samples each long plane once (4 planes of 64 KiB a chunk); the later ones only at the positions
    due to be judged again (about one in REJUDGE_EVERY), and every version restores bit for bit.
    Against a save that samples every plane, the bytes written differ by under 1%."""
    calls = _counting_trials(monkeypatch)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16384, 64, generator=g) * 0.05
    states, written = [], []
    with deltackpt.Repo(str(tmp_path / "r"), create=True, chunk_bytes=1 << 18, deltify=False) as repo:
        for step in range(6):
            calls.clear()
            w = w + 1e-3 * torch.randn(w.shape, generator=g)
            v = repo.save({"w": w}, step=step)
            states.append(w.clone())
            written.append(v.written_bytes)
            if step == 0:
                assert len(calls) == 16 * 4
            else:
                assert len(calls) <= 16 * 4 // 2, (step, len(calls))   # was 64 at every save
        later = len(calls)
        for back, want in enumerate(reversed(states)):
            assert deltackpt.load(repo, f"latest~{back}")["w"].view(torch.int32).equal(want.view(torch.int32))
    assert later < 16 * 4 and REJUDGE_EVERY > 1
    real = bytegroup.compress_planes_choosing   # every plane sampled at every save, as before
    monkeypatch.setattr(bytegroup, "compress_planes_choosing",
                        lambda out, width, level, choices=None: real(out, width, level, None))
    with deltackpt.Repo(str(tmp_path / "sampled"), create=True, chunk_bytes=1 << 18, deltify=False) as repo:
        sampled = [repo.save({"w": s}, step=i).written_bytes for i, s in enumerate(states)]
    assert abs(sum(written) - sum(sampled)) < 0.01 * sum(sampled), (written, sampled)


def test_a_remembered_compression_that_no_longer_pays_is_dropped():
    """Planes that compressed well are remembered as compressed; given incompressible bytes at the
    next save, the remembered choice is tried once, the plane is stored raw, and the choice
    recorded for the save after is raw (no zstd pass a save for nothing)."""
    rng = np.random.default_rng(0)
    n = 4 * 2 * bytegroup._SAMPLE + 4 * 1024          # planes longer than two samples
    smooth = (rng.standard_normal(n // 4) * 0.05).astype(np.float32).view(np.uint8)
    _p, _pay, choices = bytegroup.encode_planes_choosing(smooth, 4, 1)
    assert choices[3] != bytegroup.PLANE_RAW          # an exponent plane pays
    noise = rng.integers(0, 256, n, dtype=np.uint8)
    params, payload, after = bytegroup.encode_planes_choosing(noise, 4, 1, choices)
    assert after == (bytegroup.PLANE_RAW,) * 4
    assert params["m"] == [0, 0, 0, 0]
    assert bytes(bytegroup.decode_planes(params, bytes(payload), n, what="t")) == noise.tobytes()
    # and a plane remembered raw is not compressed, though it would pay now
    params, payload, again = bytegroup.encode_planes_choosing(smooth, 4, 1, after)
    assert params["m"] == [0, 0, 0, 0] and again == after
    assert bytes(bytegroup.decode_planes(params, bytes(payload), n, what="t")) == smooth.tobytes()


def test_a_dense_position_measures_whether_it_stays_whole_only_now_and_then(tmp_path, monkeypatch):
    """A position whose change stays dense is judged again at every save on the sample the handle
    kept (a sparse-rows trial: a change turning sparse is caught at the next save), but once the
    position is flagged to stay whole, the dense delta's sample that says so is taken again at
    about one save in REJUDGE_EVERY; in between the flag stands (its packs' placement with it).
    A position not flagged is measured at every save, as before (bench/MAINTENANCE.md says why)."""
    from deltackpt.repo.write import chunk_encoder
    trials = {"sparse": 0, "dense": 0}
    real = chunk_encoder.sample_delta_fraction

    def counted(*args, **kwargs):
        trials["sparse" if kwargs.get("sparse") else "dense"] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(chunk_encoder, "sample_delta_fraction", counted)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16384, 64, generator=g) * 0.05
    with deltackpt.Repo(str(tmp_path / "r"), create=True, chunk_bytes=1 << 18, deltify=False) as repo:
        for step in range(6):
            w = w + 1e-3 * torch.randn(w.shape, generator=g)
            trials["sparse"] = trials["dense"] = 0
            repo.save({"w": w}, step=step)
            if step >= 2:   # every position known dense, with its sample kept
                assert trials["sparse"] == 16, (step, trials)
                assert trials["dense"] <= 16 // 2, (step, trials)   # was 16 at every save
        lasting = [m.lasting for m in repo.session.delta_cache._items.values()]
    assert len(lasting) == 16 and all(lasting)   # a random walk's change: its keyframes stay whole
