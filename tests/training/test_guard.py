"""The divergence guard on real training runs: NaN and spike detection, in-place rollback
bit-identical to deltackpt.load of the target, the data window skipped, the cap, holds against
retention, a rollback while a background save is pending, named targets, abandoned versions."""

from __future__ import annotations

import math

import pytest

import deltackpt
from deltackpt.errors import DivergenceError, InvalidArgumentError
from deltackpt.repo.maintain import events
from deltackpt.training import Guard, Ratio, Spike, rng, targets
from tests.strategies import assert_bit_identical
from tests.training._guarded import make_run, train

NAN_AT = 33


def _once(at: int, factor: float):
    """Scale the targets of the batch at step ``at`` by ``factor``, the first time only (a replay
    after the rollback trains on clean data)."""
    fired = []

    def poison(step, idx):
        if step == at and not fired:
            fired.append(step)
            return factor
        return None
    return poison


def _nan_once(at: int):
    return _once(at, math.nan)


def test_nan_loss_rolls_back_to_the_newest_version_before_it(repo_path):
    """A NaN loss at step 33 rolls the run back to the version of step 30 (the newest older than
    step 33 by the default margin of 1), skips the data consumed since, commits the restored state
    and records the event; training then finishes with finite losses."""
    run = train(make_run(repo_path), 60, _nan_once(NAN_AT))
    assert len(run.rollbacks) == 1
    rb = run.rollbacks[0]
    assert (rb.from_step, rb.bad_start, rb.step, rb.version.step) == (NAN_AT, NAN_AT, 30, 30)
    assert rb.verdict.rule == "nonfinite" and math.isnan(rb.verdict.value)
    assert rb.committed is not None and rb.committed.step == 30
    assert rb.skipped == [[0, 30 * 8], [0, NAN_AT * 8]]
    assert all(math.isfinite(v) for s, v in run.losses[-20:])
    (e,) = events.usable(deltackpt.Repo(repo_path).core, "rollback")
    assert (e.id, e.data["version"], e.data["step"], e.data["to_step"]) == (rb.event, rb.version.id, NAN_AT, 30)
    assert e.data["committed"] == rb.committed.id and e.data["bytes_read"] == rb.bytes_read > 0
    assert math.isnan(e.data["value"]) and e.data["values"][-1][0] == NAN_AT


def test_a_loss_spike_fires_the_default_rule(repo_path):
    """Targets scaled by 30 at one step make a loss spike far above the robust threshold: the guard
    rolls back; ordinary steps before it never fired."""
    run = train(make_run(repo_path), 70, _once(52, 30.0))
    (rb,) = run.rollbacks
    assert (rb.from_step, rb.verdict.rule, rb.step) == (52, "spike", 50)
    assert rb.verdict.value > rb.verdict.threshold > rb.verdict.baseline


@pytest.mark.parametrize("opt,scaler", [("adamw", True), ("sgd", False), ("sparse", False)])
def test_rollback_is_bit_identical_to_load_of_the_target(repo_path, opt, scaler):
    """After the rollback, model, optimizer (AdamW, SGD with momentum, SparseAdam), scheduler,
    GradScaler and every RNG hold exactly what deltackpt.load of the target version holds; the
    sampler holds the position it had when the guard fired (the window is skipped)."""
    run = make_run(repo_path, opt=opt, scaler=scaler, guard={"commit": False})
    train(run, NAN_AT - 1)
    live_sampler = None

    def poison(step, idx):
        nonlocal live_sampler
        if step == NAN_AT:
            live_sampler = dict(run.sampler.state_dict(), consumed=run.sampler.consumed)
            return math.nan
        return None

    train(run, NAN_AT, poison, stop=lambda r: bool(r.rollbacks))
    (rb,) = run.rollbacks
    rng_now = rng.capture()      # nothing drew from a generator since the restore
    saved = deltackpt.load(repo_path, rb.version.id)
    assert_bit_identical(saved["model"], run.model.state_dict(), "model")
    assert_bit_identical(saved["optimizer"], run.opt.state_dict(), "optimizer")
    assert saved["scheduler"] == run.sched.state_dict()
    if scaler:
        assert saved["scaler"] == run.scaler.state_dict()
    assert_bit_identical(saved["rng"], rng_now, "rng")
    assert run.sampler.state_dict() == live_sampler


def test_rollback_reads_only_what_differs(repo_path):
    """Rolling back reads the chunks that changed since the target, not the whole state: with a
    frozen first layer its weights are not read again."""
    run = make_run(repo_path, guard={"commit": False})
    run.model.net[0].requires_grad_(False)
    train(run, NAN_AT, _nan_once(NAN_AT))
    (rb,) = run.rollbacks
    full = deltackpt.Repo(repo_path).show(rb.version.id)["tensors"]
    stored = sum(t["stored_bytes"] for t in full)
    frozen = sum(t["stored_bytes"] for t in full if t["name"].startswith("model.net.0."))
    assert 0 < rb.bytes_read <= stored - frozen


def test_skip_moves_past_the_window_and_reseed_reshuffles_it(repo_path, tmp_path):
    """data='skip': none of the samples consumed between the target and the spike is trained on
    again in that epoch.  data='reseed': the rest of the epoch comes in another order, every
    sample still once."""
    run = train(make_run(repo_path), 45, _nan_once(NAN_AT))
    (rb,) = run.rollbacks
    first, after = run.seen[:NAN_AT], run.seen[NAN_AT:]
    assert [s for s, _ in first] == list(range(1, NAN_AT + 1)) and after[0][0] == 31 and run.sampler.epoch == 0
    window = {i for _, idx in first[30:] for i in idx}
    order = run.sampler._order()
    assert sorted(window) == sorted(order[240:264])
    assert not window & {i for _, idx in after for i in idx}
    assert [i for _, idx in after for i in idx] == order[264:264 + 8 * len(after)]

    other = make_run(str(tmp_path / "r2"), guard={"data": "reseed"})
    train(other, 45, _nan_once(NAN_AT))
    (rb2,) = other.rollbacks
    assert rb2.skipped is None and other.sampler.reshuffled == [[30 * 8, NAN_AT]]
    replayed = [idx for s, idx in other.seen[NAN_AT:NAN_AT + 3]]
    first_pass = [idx for s, idx in other.seen[30:NAN_AT]]
    assert replayed != first_pass and sorted(other.sampler._order()) == list(range(other.sampler.n))


def test_lr_scale_scales_the_restored_rate_and_the_schedule(repo_path):
    run = train(make_run(repo_path, guard={"lr_scale": 0.5, "data": "replay"}), NAN_AT, _nan_once(NAN_AT))
    (rb,) = run.rollbacks
    saved = deltackpt.load(repo_path, rb.version.id)
    assert run.opt.param_groups[0]["lr"] == pytest.approx(0.5 * saved["optimizer"]["param_groups"][0]["lr"])
    assert run.sched.base_lrs == [pytest.approx(0.5 * 1e-2)]


def test_the_cap_raises_a_typed_error(repo_path):
    """A run that diverges again after every rollback (the same poison each time) is rolled back
    max_rollbacks times, then DivergenceError names the repository, the value and the cap."""
    run = make_run(repo_path, guard={"max_rollbacks": 2, "data": "replay"})
    with pytest.raises(DivergenceError, match=r"keeps diverging \(2 rollbacks within 1000 steps"):
        train(run, 60, lambda step, idx: math.nan if step == NAN_AT else None)
    assert len(run.rollbacks) == 2
    assert len(events.usable(deltackpt.Repo(repo_path).core, "rollback")) == 2


def test_no_version_before_the_bad_stretch_raises(repo_path):
    run = make_run(repo_path, every=50)
    with pytest.raises(DivergenceError, match="no version of this run older than step 3"):
        train(run, 10, _nan_once(4))


def test_versions_of_the_bad_stretch_are_never_targets(repo_path):
    """Spikes lasting 3 steps with patience 3: versions saved inside the stretch (step 35) are
    abandoned; a later fire never goes back to them, even in a new process (read from events)."""
    run = make_run(repo_path, every=5, guard={"patience": 3})
    poison = lambda step, idx: 40.0 if 34 <= step <= 36 and not run.rollbacks else None  # noqa: E731
    train(run, 35, poison)
    bad = {v.id for v in deltackpt.Repo(repo_path).log() if v.step == 35}
    train(run, 60, poison)
    (rb,) = run.rollbacks
    assert (rb.bad_start, rb.from_step, rb.step) == (34, 36, 30)
    assert len(bad) == 1 and bad <= set(rb.abandoned)
    fresh = Guard(repo_path, model=run.model, optimizer=run.opt, start_step=60)
    assert bad <= fresh._abandoned
    found = targets.candidates(deltackpt.Repo(repo_path), before=100, excluded=fresh._abandoned,
                               preexisting=fresh._preexisting, start_step=60, needs=("model",))
    assert found and not any(c.id in bad for c in found)


def test_named_target_best_metric_among_candidates(repo_path):
    """target='best:val' goes to the best version by val among the candidates, not the newest."""
    run = make_run(repo_path, guard={"target": "best:val"})
    vals = {5: 0.9, 10: 0.2, 15: 0.5, 20: 0.7, 25: 0.8, 30: 0.95}
    orig = run.ckpt.step

    def step_with_val(state, *, step, metrics=None, **kw):
        val = {"val": vals[step]} if step in vals else {}
        return orig(state, step=step, metrics={**(metrics or {}), **val}, **kw)
    run.ckpt.step = step_with_val
    train(run, 40, _nan_once(NAN_AT))
    (rb,) = run.rollbacks
    assert rb.version.step == 10


def test_retention_keeps_the_target_while_the_run_lives(repo_path):
    """keep_last=1 retention runs after every save; the version rolled back to stays while the
    guard lives (a hold), and goes at the first gc after the run closed."""
    run = make_run(repo_path, ckpt={"retention": deltackpt.Retention(keep_last=1)})
    train(run, 70, _nan_once(NAN_AT))
    (rb,) = run.rollbacks
    repo = deltackpt.Repo(repo_path)
    assert rb.version.id in {v.id for v in repo.log()}
    report = deltackpt.gc(repo_path, keep_last=1)
    assert any(why.startswith("held by") for why in report.kept[rb.version.id])
    run.ckpt.close()
    deltackpt.gc(repo_path, keep_last=1)
    assert rb.version.id not in {v.id for v in deltackpt.Repo(repo_path).log()}


def test_rollback_while_a_background_save_is_pending(repo_path, inject):
    """blocking=False: the save of step 30 (its manifest write held up 1.5 s) is still running when
    step 33's NaN fires; the guard lets it commit, judges it with the others and takes it."""
    inject("manifest.write:10:sleep1.5")   # the 10th save: step 30
    run = make_run(repo_path, ckpt={"blocking": False}, every=3)
    pending = []
    nan = _nan_once(NAN_AT)

    def poison(step, idx):
        if step == NAN_AT:
            pending.append(not run.ckpt.last.done())
        return nan(step, idx)

    train(run, NAN_AT, poison, stop=lambda r: bool(r.rollbacks))
    (rb,) = run.rollbacks
    assert pending == [True]
    assert rb.version.step == 30 and rb.committed is not None and rb.committed.step == 30
    run.ckpt.close()


def test_ratio_rule_and_bad_arguments():
    r = Ratio(factor=2.0, alpha=0.5, min_history=2)
    for v in (1.0, 1.0):
        assert r.judge("loss", v) is None
        r.add(v)
    assert r.judge("loss", 2.5).rule == "ratio" and r.judge("loss", 1.5) is None
    s = Spike(window=10, threshold=3.0, min_history=3, direction="down")
    for v in (0.9, 0.91, 0.9):
        s.add(v)
    assert s.judge("acc", 0.5).rule == "spike" and s.judge("acc", 0.95) is None
    for bad in ({"patience": 0}, {"margin": -1}, {"lr_scale": 0}, {"data": "rewind"}, {"watch": []},
                {"rule": "spike"}, {"data": "reseed"}):
        with pytest.raises(InvalidArgumentError):
            Guard(**bad)
    with pytest.raises(InvalidArgumentError, match="no repository"):
        Guard().check(1, {"loss": 1.0})
