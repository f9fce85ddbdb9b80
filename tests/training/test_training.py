"""Training-loop integration: policies, Checkpointer + retention, RNG capture, sampler, exact resume."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import deltackpt
from deltackpt.errors import DeltackptError, StateMismatchError
from deltackpt.training import rng
from deltackpt.training.policies import AnyOf, DenseEarly, EveryN, EveryT, OnImprovement, YoungDaly, as_policy
from deltackpt.training import Checkpointer, ResumableSampler, resume, training_state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "plain_loop.py")


def _plain_loop():
    spec = importlib.util.spec_from_file_location("plain_loop_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _due_steps(policy, steps, metrics=lambda s: {}, now=lambda s: float(s)):
    out = []
    for s in steps:
        if policy.due(s, now(s), metrics(s)):
            out.append(s)
            policy.saved(s, now(s), 0.01, metrics(s))
    return out


# policies ---------------------------------------------------------------------------------------
def test_every_n_and_every_t():
    """EveryN saves each N steps; EveryT each T seconds of the clock it is given."""
    assert _due_steps(EveryN(10), range(1, 36)) == [10, 20, 30]
    assert _due_steps(EveryT(2.5), range(1, 12), now=lambda s: s * 1.0) == [4, 7, 10]


def test_every_n_keeps_its_phase_beside_other_policies():
    """EveryN(20) beside a policy that saved at step 3 still saves at 20, 40, 60 (it once saved at
    23, 43, 63: it counted from the last save, whichever policy made it)."""
    early = OnImprovement("val")
    both = AnyOf(EveryN(20), early)
    saves = _due_steps(both, range(1, 70), metrics=lambda s: {"val": 1.0 if s == 3 else 5.0 + s})
    assert saves == [1, 3, 20, 40, 60]
    assert _due_steps(EveryN(10), [3, 9, 12, 14, 25, 30]) == [12, 25, 30]   # a skipped multiple: the first step past it


def test_young_daly_follows_measured_cost():
    """The Young/Daly interval is sqrt(2*C*MTBF) and moves when the measured save cost changes."""
    p = YoungDaly(mtbf=800.0, initial_cost=1.0, smoothing=1.0)
    assert p.interval == pytest.approx(40.0)
    p.due(0, 0.0, {})
    p.saved(0, 0.0, 0.25, {})
    assert p.interval == pytest.approx(20.0)
    assert not p.due(1, 19.0, {}) and p.due(2, 20.5, {})
    p.saved(2, 20.5, 4.0, {})
    assert p.interval == pytest.approx(80.0)


def test_dense_early_gaps_grow():
    """The COCI-like schedule saves densely early and with growing gaps up to a cap."""
    saves = _due_steps(DenseEarly(first=10, growth=1.5, max_every=40), range(1, 300))
    gaps = np.diff([0] + saves)
    assert saves[:4] == [10, 25, 47, 81]
    assert list(gaps) == sorted(gaps) and gaps[-1] == 40


def test_on_improvement_and_any_of():
    """OnImprovement saves only when the metric beats its best; AnyOf saves when any policy is due."""
    vals = {1: 5.0, 2: 4.0, 3: 4.5, 4: 3.9, 5: 3.95}
    assert _due_steps(OnImprovement("val"), vals, metrics=lambda s: {"val": vals[s]}) == [1, 2, 4]
    assert _due_steps(OnImprovement("acc", mode="max"), vals, metrics=lambda s: {"acc": vals[s]}) == [1]
    both = AnyOf(EveryN(3), OnImprovement("val"))
    assert _due_steps(both, vals, metrics=lambda s: {"val": vals[s]}) == [1, 2, 3, 4]   # 3: EveryN's multiple
    assert isinstance(as_policy([5, OnImprovement("x")]), AnyOf)
    with pytest.raises(DeltackptError):
        as_policy("often")
    with pytest.raises(DeltackptError):
        EveryN(0)


# Checkpointer -----------------------------------------------------------------------------------
def test_checkpointer_saves_per_policy_and_applies_retention(repo_path):
    """The Checkpointer saves when due, calls a state factory only then, and gc keeps the retained versions."""
    model = torch.nn.Linear(32, 32)
    calls = []

    def state():
        calls.append(1)
        return training_state(model=model, step=step)

    ckpt = Checkpointer(repo_path, policy=EveryN(5),
                        retention=deltackpt.Retention(keep_last=2, keep_best=("val", 1, "min")))
    for step in range(1, 31):
        with torch.no_grad():
            model.weight.add_(0.01)
        ckpt.step(state, step=step, metrics={"val": abs(step - 10)})
    ckpt.close()
    assert len(calls) == 6 and ckpt.saves == 6
    assert sorted(v.step for v in deltackpt.Repo(repo_path).log()) == [10, 25, 30]
    assert deltackpt.Repo(repo_path).verify().ok


def test_checkpointer_blocking_mode(repo_path):
    """blocking=True saves in the foreground and returns the committed Version."""
    ckpt = Checkpointer(repo_path, policy=2, blocking=True)
    assert ckpt.step({"w": torch.ones(3)}, step=1) is None
    v = ckpt.step({"w": torch.ones(3)}, step=2)
    assert isinstance(v, deltackpt.Version) and v.step == 2


def test_resumed_checkpointer_remembers_the_best_metric(repo_path):
    """A Checkpointer resumed at step S with OnImprovement compares against the best metric of the
    versions saved up to S (not those of an abandoned later trajectory), so it does not save a
    worse value as an 'improvement' right after the restart."""
    ckpt = Checkpointer(repo_path, policy=OnImprovement("val"), blocking=True)
    for step, val in [(1, 5.0), (2, 3.0), (3, 4.0), (4, 1.0)]:
        ckpt.step({"w": torch.full((3,), float(step))}, step=step, metrics={"val": val})
    assert [v.step for v in deltackpt.Repo(repo_path).log()] == [4, 2, 1]
    resumed = Checkpointer(repo_path, policy=[EveryN(100), OnImprovement("val")], blocking=True, start_step=2)
    assert resumed.step({"w": torch.ones(3)}, step=3, metrics={"val": 3.5}) is None, "3.5 is no better than 3.0"
    assert resumed.step({"w": torch.ones(3)}, step=4, metrics={"val": 2.0}) is not None, "2.0 beats 3.0 (1.0 was abandoned)"


# RNG and sampler --------------------------------------------------------------------------------
def test_rng_round_trips_through_repository_without_pickle(repo_path):
    """Python, numpy and torch draws after a restore from the repository equal the draws after the capture."""
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    np.random.normal()  # leaves a cached gaussian in numpy's state
    deltackpt.save({"rng": rng.capture()}, repo_path)
    expected = (random.random(), np.random.normal(size=3).tolist(), torch.rand(3).tolist())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    rng.restore(deltackpt.load(repo_path)["rng"])
    assert (random.random(), np.random.normal(size=3).tolist(), torch.rand(3).tolist()) == expected
    dtypes = {t["name"]: t["dtype"] for t in deltackpt.Repo(repo_path).show()["tensors"]}
    assert dtypes["rng.numpy.keys"] == "uint32" and dtypes["rng.torch"] == "uint8"
    with pytest.raises(StateMismatchError):
        rng.restore({"python": {}})


def test_sampler_resumes_mid_epoch():
    """A sampler restored from a mid-epoch state yields exactly the rest of that epoch, then the next one."""
    a = ResumableSampler(20, seed=1)
    it = iter(a)
    head = [next(it) for _ in range(7)]
    b = ResumableSampler(20, seed=1)
    b.load_state_dict(a.state_dict())
    rest = list(b)
    full = list(ResumableSampler(20, seed=1))
    assert head + rest == full and sorted(full) == list(range(20))
    assert b.epoch == 1 and list(b) != full
    with pytest.raises(StateMismatchError):
        ResumableSampler(21).load_state_dict(a.state_dict())


# resume -----------------------------------------------------------------------------------------
def _train(model, opt, sched, steps, ckpt=None, start=0):
    for step in range(start + 1, steps + 1):
        x = torch.randn(8, 16) + float(np.random.rand()) + random.random()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if ckpt is not None:
            ckpt.step(lambda: training_state(model=model, optimizer=opt, scheduler=sched, step=step), step=step,
                      metrics={"val_loss": float(abs(step - 4))})


def _fresh():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)


def test_resume_skips_a_corrupt_newest_version(repo_path):
    """resume() warns about a newest version whose pack is corrupt and restores the one before it.
    Forward chains: with reverse deltas the version before decodes through the newest's keyframes, so
    damage to those reaches back to the previous retained keyframe (spec §10)."""
    deltackpt.Repo.init(repo_path, delta_base="parent")  # forward chains are what this pins
    model, opt, sched = _fresh()
    ckpt = Checkpointer(repo_path, policy=1, blocking=True)
    _train(model, opt, sched, 2, ckpt)
    packs = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(repo_path, "packs")) for f in fs]
    newest = max(packs, key=os.path.getmtime)
    with open(newest, "r+b") as f:
        f.seek(os.path.getsize(newest) // 2)
        f.write(b"\xff" * 64)
    m2, o2, s2 = _fresh()
    with pytest.warns(RuntimeWarning, match="does not load"):
        info = resume(repo_path, model=m2, optimizer=o2, scheduler=s2)
    assert info.step == 1 and len(info.skipped) == 1
    with pytest.raises(DeltackptError):
        resume(repo_path, model=m2, version=info.skipped[0])


def test_resume_best_rolls_back_and_fresh_repo_returns_none(repo_path, tmp_path):
    """version='best:val_loss' restores the best-scoring version; a missing repository means a fresh start."""
    assert resume(str(tmp_path / "nothing"), model=torch.nn.Linear(1, 1)) is None
    model, opt, sched = _fresh()
    ckpt = Checkpointer(repo_path, policy=1, blocking=True)
    _train(model, opt, sched, 6, ckpt)
    best = deltackpt.load(repo_path, "best:val_loss")
    m2, o2, s2 = _fresh()
    info = resume(repo_path, model=m2, optimizer=o2, scheduler=s2, version="best:val_loss")
    assert info.step == 4 and info.metrics["val_loss"] == 0.0 and s2.last_epoch == 4
    for k, v in m2.state_dict().items():
        assert torch.equal(v, best["model"][k])


def test_sigkill_and_resume_is_bit_identical(tmp_path, capsys):
    """A run SIGKILLed mid-training (a real subprocess) and resumed from the repository ends with weights
    bit-identical to an uninterrupted run."""
    args = ["--steps", "90", "--every", "10", "--hidden", "64"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    killed = str(tmp_path / "killed")
    proc = subprocess.Popen([sys.executable, EXAMPLE, "--repo", killed, *args], stdout=subprocess.PIPE,
                            text=True, env=env)
    reached = 0
    try:
        for line in proc.stdout:
            if line.startswith("step "):
                reached = int(line.split()[1])
                if reached >= 47:
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL and 47 <= reached < 90
    example = _plain_loop()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the killed run had: the same kernels, the same bits
    try:
        capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert example.main(["--repo", killed, "--final", str(tmp_path / "final-resumed"), *args]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith("resumed at step ") and 10 <= int(first.split()[-1]) <= reached
        assert example.main(["--repo", str(tmp_path / "straight"), "--final", str(tmp_path / "final-straight"),
                             *args]) == 0
    finally:
        torch.set_num_threads(threads)
    a = deltackpt.load(str(tmp_path / "final-resumed"))
    b = deltackpt.load(str(tmp_path / "final-straight"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


# retention through the CLI ----------------------------------------------------------------------
def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if not d.endswith("locks"))


@pytest.mark.parametrize("bases", [False, True])
def test_gc_dry_run_reports_exact_versions_and_bytes(repo_path, bases):
    """`deltackpt gc --dry-run` names the versions the real run removes and the exact net bytes it
    reclaims (negative when rebasing deltas to keyframes costs more), dedup and deltas included."""
    import json
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    for i in range(8):
        with torch.no_grad():
            m[0].weight[i * 8:(i + 1) * 8].add_(0.1)   # sparse change: most chunks dedup
            if i % 3 == 0:
                m[1].weight.mul_(1.0001)                # dense change: stored as a delta
        deltackpt.save(m, repo_path, step=i * 500, metrics={"val_loss": [5, 3, 4, 1, 6, 2, 7, 8][i]})
    args = [sys.executable, "-m", "deltackpt.cli.main", "gc", "--repo", repo_path, "--keep-last", "3",
            "--keep-best", "val_loss:2", "--keep-every", "2000", "--json", "--grace", "0"]
    args += ["--keep-bases"] if bases else []
    env = {**os.environ, "PYTHONPATH": ROOT}
    dry = json.loads(subprocess.run(args + ["--dry-run"], capture_output=True, text=True, env=env, check=True).stdout)
    before = _dir_bytes(repo_path)
    real = json.loads(subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout)
    steps = {v.id: v.step for v in deltackpt.Repo(repo_path).log()}
    assert sorted(steps.values()) == [0, 1500, 2000, 2500, 3000, 3500]
    assert dry["removed"] == real["removed"] and len(dry["removed"]) == 2 and not set(dry["removed"]) & set(steps)
    # gc's own figure is exact in a dry run; the deltification that follows it (not estimated) adds its own
    assert dry["reclaimed_bytes"] == real["reclaimed_bytes"]
    assert before - _dir_bytes(repo_path) == (real["reclaimed_bytes"] + real["deltify_freed_bytes"]
                                              - real["deltified_bytes"])
    assert deltackpt.Repo(repo_path).verify().ok


def test_policies_continue_after_resume():
    """After a restart at step S, step schedules continue from S instead of starting over."""
    p = EveryN(10)
    p.resumed(47, 0.0)
    assert _due_steps(p, range(48, 70)) == [50, 60]   # the multiples the run would have saved at
    d = DenseEarly(first=10, growth=1.5, max_every=40)
    d.resumed(30, 0.0)   # the schedule had saves at 10 and 25; the next gap is 22
    assert _due_steps(d, range(31, 60)) == [52]


def test_gc_rebases_incompressible_chunks_to_raw(repo_path):
    """gc rebasing a chunk whose keyframe does not compress stores it raw, and every kept version still loads."""
    deltackpt.Repo.init(repo_path, delta_base="parent")  # forward chains are what this pins
    torch.manual_seed(0)
    w = torch.randint(0, 256, (4096,), dtype=torch.uint8)   # random bytes: a keyframe does not compress
    for i in range(4):
        w = torch.cat([w[:1] + 1, w[1:]])                    # a one-byte change: stored as an XOR delta
        deltackpt.save({"w": w}, repo_path, step=i)
    report = deltackpt.gc(repo_path, keep_last=1, grace_seconds=0)
    assert len(report.removed) == 3 and report.chunks_rebased >= 1
    assert torch.equal(deltackpt.load(repo_path)["w"], w) and deltackpt.Repo(repo_path).verify().ok


def test_resume_after_a_long_history_decodes_only_the_version_it_restores(tmp_path, monkeypatch):
    """``resume`` orders the history by the manifests' heads and decodes a manifest whole only for
    the version it loads: after 12 versions of a 32-tensor state it decodes one (it decoded all
    12, each ~3 ms for 320 tensors, before the newest was even tried), and an off-line version
    (an import) newer than the training line is still passed over."""
    from deltackpt.format import manifest as manifest_fmt
    path = str(tmp_path / "repo")
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(16)])
    for step in range(12):
        with torch.no_grad():
            model[0].weight.add_(1.0)
        deltackpt.save(training_state(model=model, step=step), path, step=step)
    deltackpt.save({"model": model.state_dict()}, path, latest=False, tag="imported")   # newest, off the line
    decoded: list[bytes] = []
    real = manifest_fmt.decode

    def counting(data, **kw):
        decoded.append(data)
        return real(data, **kw)

    monkeypatch.setattr(manifest_fmt, "decode", counting)
    fresh = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(16)])
    info = resume(path, model=fresh)
    assert info is not None and info.step == 11
    assert torch.equal(fresh[0].weight, model[0].weight)
    assert len(decoded) == 1, len(decoded)


def test_rollback_targets_are_found_without_decoding_a_manifest_whole(tmp_path, monkeypatch):
    """The guard's rollback candidates (training/targets.py) come from the manifests' heads and
    summaries: over 8 versions, none is decoded whole, and they are what the whole manifests say
    (the steps below the bound, holding a model, newest first)."""
    from deltackpt.format import manifest as manifest_fmt
    from deltackpt.training import targets
    path = str(tmp_path / "repo")
    model = torch.nn.Linear(4, 4)
    for step in range(8):
        state = training_state(model=model, step=step) if step != 5 else {"step": step, "other": torch.ones(2)}
        deltackpt.save(state, path, step=step)
    real = manifest_fmt.decode
    decoded: list[bytes] = []
    monkeypatch.setattr(manifest_fmt, "decode", lambda data, **kw: decoded.append(data) or real(data, **kw))
    with deltackpt.Repo(path) as repo:
        found = targets.candidates(repo, before=7, excluded=set(), preexisting=set(), start_step=None, needs=("model",))
        later = targets.later_than(repo, 3, set())
    assert [c.step for c in found] == [6, 4, 3, 2, 1, 0] and decoded == []
    assert sorted(deltackpt.Repo(path).resolve(v).step for v in later) == [4, 5, 6, 7]
