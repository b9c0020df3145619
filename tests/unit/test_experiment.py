"""A live serving run's figures: compliance counts failures as misses, switch effects."""

from __future__ import annotations

import json
import math

import pytest

from compass.dataplane.load import RequestRecord
from compass.domain.profiles import LatencyProfile
from compass_dev.experiment import LiveRun, SwitchEvent


def _run(
    records: list[RequestRecord], sent: int, switch_events: tuple[SwitchEvent, ...] = ()
) -> LiveRun:
    return LiveRun("policy", 1000.0, sent, tuple(records), switch_events=switch_events)


def test_compliance_counts_failed_and_missing_requests_as_misses() -> None:
    records = [
        RequestRecord(0.0, 0.5, "a", 1.0, None),
        RequestRecord(1.0, 1.5, "a", 0.0, None),  # late
        RequestRecord(2.0, 0.2, None, None, "unavailable"),  # failed
    ]
    run = _run(records, sent=4)  # one never came back
    assert run.compliance == pytest.approx(25.0)
    assert run.failed == 2
    assert run.accuracy == pytest.approx(0.5)
    assert list(run.latencies_ms) == [500.0, 1500.0]
    assert list(run.arrivals_s) == [0.0, 1.0]


def test_an_empty_run_has_no_accuracy_and_no_percentile() -> None:
    run = _run([], sent=0)
    assert run.compliance == 0.0
    assert math.isnan(run.accuracy)
    assert math.isnan(run.percentile_ms(95))


def test_switch_effect_is_the_first_reply_of_the_new_configuration_after_the_decision() -> None:
    records = [
        RequestRecord(9.0, 2.0, "old", 1.0, None),  # finishes at 11 on the old one
        RequestRecord(10.5, 1.0, "new", 1.0, None),  # first reply of "new" at 11.5
        RequestRecord(11.0, 0.2, "new", 1.0, None),  # 11.2: earlier still
        RequestRecord(5.0, 0.5, "new", 1.0, None),  # before the decision: not an effect
    ]
    events = (SwitchEvent(10.0, "new", 0.2), SwitchEvent(20.0, "never", 0.3))
    run = _run(records, sent=4, switch_events=events)
    assert run.switches == 2
    # The second switch never served a reply: it has no effect to report.
    assert run.switch_effects_s() == [pytest.approx(1.2)]


def test_served_accuracy_credits_each_answer_with_its_configurations_accuracy() -> None:
    fast, accurate = {"k": 1, "m": "fast"}, {"m": "accurate", "k": 2.0}
    records = [
        # Keys as a router may write them (any key order, 2.0 for 2): canonicalised.
        RequestRecord(0.0, 0.1, json.dumps(fast), 0.0, None),
        RequestRecord(1.0, 0.1, json.dumps({"m": "fast", "k": 1}), 1.0, None),
        RequestRecord(2.0, 0.3, json.dumps(accurate), 0.0, None),
        RequestRecord(3.0, 0.1, None, None, "late: refused"),  # not answered: not counted
    ]
    run = _run(records, sent=4)
    front = [
        LatencyProfile(fast, 0.7, 100.0, 120.0),
        LatencyProfile({"k": 2, "m": "accurate"}, 0.9, 300.0, 350.0),
    ]
    # The answers scored 1/3; what served them is worth (0.7 + 0.7 + 0.9) / 3.
    assert run.accuracy == pytest.approx(1 / 3)
    assert run.served_accuracy(front) == pytest.approx(2.3 / 3)
    assert run.served_keys == (front[0].key, front[0].key, front[1].key)
    assert math.isnan(_run([], sent=0).served_accuracy(front))
    # A member the front does not hold is named, not guessed.
    with pytest.raises(ValueError, match="not on the front"):
        run.served_accuracy(front[:1])
