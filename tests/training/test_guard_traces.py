"""No false alarm from the guard's default rules on recorded clean runs: the loss series of real
training runs (`python -m bench guard_clean_traces`: MiniLM full and frozen fine-tunes at batch sizes 1 to 16, the
recommendation model with Zipf ids, two small GPTs from scratch, the MLP classifier of
examples/divergence.py whose loss falls 100-fold) replayed step by step through a Guard with its
defaults (spike, sustained level, non-finite).  They never fire, and the level rule stays well
short of its threshold (the headroom below is what docs/guide/rollback.md quotes)."""

from __future__ import annotations

import json
import os

import pytest

from deltackpt.training import Guard, Rules, Spike, Sustained
from deltackpt.training.detect import default_rule
from tests.conftest import ROOT

TRACES = os.path.join(ROOT, "bench", "results", "guard_traces.json")


def _runs() -> dict:
    with open(TRACES) as f:
        return json.load(f)["main"]["runs"]


def test_the_recorded_runs_are_what_the_docs_say():
    runs = _runs()
    assert len(runs) == 9 and all(len(r["trace"]) >= 300 for r in runs.values())
    assert {"minilm-full-b1", "minilm-full-b2", "minilm-frozen-b2", "minilm-frozen-b16", "recsys-b64", "recsys-b8",
            "gpt-b2", "gpt-b8", "mlp-classifier"} == set(runs)


@pytest.mark.parametrize("name", sorted(_runs()))
def test_default_rules_never_fire_on_a_clean_run(repo_path, name):
    """Every step's loss through Guard(): no rollback (a fire would need a version: with none, it
    raises DivergenceError, which fails the test as surely)."""
    guard = Guard(repo_path, watch="loss", commit=False)
    for step, loss, _ in _runs()[name]["trace"]:
        assert guard.check(step, {"loss": loss}) is None, (name, step, loss)
    guard.close()


def test_the_level_rule_keeps_headroom_on_every_clean_run():
    """How close Sustained() came to firing: the largest (level - best) / (threshold - best) over
    each run; 1 would fire.  At most 0.55 on any run (the batch-1 MiniLM fine-tune, the noisiest)."""
    worst = {}
    for name, run in _runs().items():
        rule, peak = Sustained(), 0.0
        for _, loss, _ in run["trace"]:
            found = rule.bound()
            if found is not None:
                best, limit = found
                window = [*list(rule.values)[-(rule.window - 1):], loss]
                level = sorted(window)[len(window) // 2] if len(window) % 2 else \
                    0.5 * (sorted(window)[len(window) // 2 - 1] + sorted(window)[len(window) // 2])
                peak = max(peak, (level - best) / (limit - best))
            assert rule.judge("loss", loss) is None, (name, loss)
            rule.observe(loss, True)
        worst[name] = round(peak, 3)
    assert max(worst.values()) <= 0.55, worst


def test_the_default_is_spike_and_sustained():
    rule = Guard(watch="loss").rules["loss"]
    assert isinstance(rule, Rules) and [type(r) for r in rule.rules] == [Spike, Sustained]
    assert type(default_rule()) is Rules
    assert isinstance(Guard(watch="loss", rule=Spike()).rules["loss"], Spike)   # a rule given is the rule used
