"""What a rollback leaves for people to see: one WARNING line through the ``deltackpt`` logger (and
the frameworks' loggers), the re-saved version labelled in ``Repo.log()`` and ``deltackpt log``, and
``deltackpt events --json`` printing each record's ``data`` as the same nested dict as
``Event.data``.  Where a bad stretch began (:mod:`deltackpt.training.onset`), from plain series."""

from __future__ import annotations

import json
import logging
import math

import pytest

import deltackpt
from deltackpt.training import Rules, Spike, Sustained
from deltackpt.training.onset import estimate
from tests.conftest import run_cli
from tests.training._guarded import make_run, train


def _nan_at_33(repo_path):
    state = {"done": False}

    def poison(step, idx):
        if step == 33 and not state["done"]:
            state["done"] = True
            return math.nan
        return None
    return train(make_run(repo_path), 45, poison)


def test_a_rollback_is_one_warning_line(repo_path, caplog):
    caplog.set_level(logging.WARNING, logger="deltackpt")
    run = _nan_at_33(repo_path)
    (rb,) = run.rollbacks
    records = [r for r in caplog.records if r.name == "deltackpt"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    line = records[0].getMessage()
    assert line == rb.message and "\n" not in line
    for part in ("rollback at step 33", "loss=nan", "(nonfinite)", "bad since step 33",
                 f"version {rb.version.id[:10]} of step 30", "data skip", "rollback 1 of 3"):
        assert part in line, (part, line)


def test_the_resaved_version_is_labelled_in_log(repo_path):
    run = _nan_at_33(repo_path)
    (rb,) = run.rollbacks
    run.ckpt.close()
    (committed,) = [v for v in deltackpt.Repo(repo_path).log() if v.id == rb.committed.id]
    assert committed.meta["rollback"] == {"to": rb.version.id, "to_step": 30, "at_step": 33, "bad_start": 33,
                                          "metric": "loss", "rule": "nonfinite"}
    text = run_cli("log", "--repo", repo_path).stdout
    (row,) = [ln for ln in text.splitlines() if ln.startswith(rb.committed.id[:10])]
    assert f"rollback to {rb.version.id[:10]} (step 30) at step 33" in row
    others = [ln for ln in text.splitlines() if ln[:10] in {v.id[:10] for v in deltackpt.Repo(repo_path).log()}
              and not ln.startswith(rb.committed.id[:10])]
    assert others and not any("rollback to" in ln for ln in others)


def test_events_json_nests_data_as_the_python_api_does(repo_path):
    _nan_at_33(repo_path).ckpt.close()
    (event,) = deltackpt.Repo(repo_path).events()
    (printed,) = json.loads(run_cli("events", "--repo", repo_path, "--json").stdout)
    assert set(printed) == {"id", "kind", "time", "data"}
    assert (printed["id"], printed["kind"], printed["time"]) == (event.id, "rollback", event.time)
    expected = json.loads(json.dumps(event.data, allow_nan=True))   # NaN survives as NaN
    assert printed["data"].keys() == expected.keys()
    assert all(printed["data"][k] == v for k, v in expected.items() if k != "value" and k != "values")
    assert math.isnan(printed["data"]["value"]) and printed["data"]["values"][-1][0] == 33
    text = run_cli("events", "--repo", repo_path).stdout
    assert "bad since step 33" in text and event.data["version"][:10] in text


# where a bad stretch began --------------------------------------------------------------------
def test_onset_is_the_first_value_of_the_run_up():
    healthy = [(s, 1.1 + 0.02 * ((s * 7) % 5 - 2)) for s in range(1, 13)]
    climb = [(13, 1.4), (14, 1.0), (15, 1.9), (16, 2.6), (17, 1.1), (18, 2.9), (19, 2.4)]
    assert estimate(healthy + climb, limit=1.2) == 13          # a dip inside the stretch does not end it
    # one stray high value earlier does not start it
    assert estimate(healthy + [(13, 1.25)] + healthy[:3] + climb[2:], limit=1.2) == 15
    assert estimate([(1, 1.0), (2, math.nan)], limit=None) == 2
    assert estimate(healthy + climb, limit=1.2, lookback=3) == 18      # within the lookback only
    assert estimate([(s, -v) for s, v in healthy + climb], limit=-1.2, direction="down") == 13


def test_sustained_fires_on_a_level_and_not_on_spikes():
    """A lone spike does not move the median; a level that doubled fires once most of the window
    holds it.  In Rules, the first rule that fires gives the verdict."""
    noise = [0.1 * ((i * 7) % 5 - 2) / 2 for i in range(60)]
    series = [1.0 + noise[i] for i in range(30)] + [9.0] + [1.0 + noise[i] for i in range(5)] + \
        [2.2 + noise[i] for i in range(12)]
    rule, fired = Sustained(window=10), []
    for i, v in enumerate(series):
        verdict = rule.judge("loss", v)
        if verdict is not None:
            fired.append(i)
            assert verdict.rule == "sustained" and verdict.value > verdict.threshold > verdict.baseline
        rule.observe(v, verdict is None)
    # not on the spike (index 30); on the level once it and the spike still in the window make 5 of 10
    assert fired and fired[0] == 39 and all(f >= 36 for f in fired)
    both = Rules(Spike(), Sustained(window=10))
    verdicts = []
    for v in series:
        verdict = both.judge("loss", v)
        verdicts.append(verdict.rule if verdict else None)
        both.observe(v, verdict is None)
    assert verdicts[30] == "spike" and verdicts[36] == "spike"   # Spike first in the list, and sure sooner


def test_sustained_bad_arguments():
    for bad in ({"window": 0}, {"rise": 0}, {"spread": -1}, {"memory": 0}, {"direction": "sideways"}):
        with pytest.raises(deltackpt.errors.InvalidArgumentError):
            Sustained(**bad)
    with pytest.raises(deltackpt.errors.InvalidArgumentError):
        Rules()
