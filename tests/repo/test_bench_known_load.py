"""The known-load oracle (bench/known_load.py): what knowing the load ahead wins, and its degrade."""

from __future__ import annotations

import pytest
from bench_runner import bench_module

from compass.domain.arrivals import SimulationError, make_pattern, make_scenario, trace_pattern
from compass.domain.oracle import hindsight_oracle
from compass.domain.simulator import StaticController, simulate
from compass_dev.scenarios import normal_profile as profile

FRONT = [
    profile("fast", 0.70, 100, 15),
    # Under the chord from fast to slow: a mix of those two beats it.
    profile("dull", 0.72, 180, 20),
    profile("mid", 0.85, 200, 20),
    profile("slow", 0.90, 300, 30),
]
known_load = bench_module("known_load")
known_load_oracle = known_load.known_load_oracle
degrading_dispatch = known_load.degrading_dispatch


def test_a_light_known_load_gets_the_most_accurate_member_in_every_window() -> None:
    scenario = make_scenario(make_pattern("constant", 0.2, 120), 1)
    known = known_load_oracle(FRONT, scenario, 5000)
    assert known.mean_accuracy == pytest.approx(0.90)
    assert known.compliance == 100.0
    assert len(known.mixes) == 24


def test_a_known_overload_keeps_the_fastest() -> None:
    scenario = make_scenario(make_pattern("constant", 30.0, 60), 2)
    known = known_load_oracle(FRONT, scenario, 400, degrade_after=0.25)
    assert known.mean_accuracy == pytest.approx(0.70, abs=0.01)


def test_knowing_the_load_wins_less_than_knowing_the_arrivals() -> None:
    """Over bursts the known-load oracle gains accuracy over static fastest, at about its
    compliance on average (it matches it in expectation, not run by run), but less than the
    hindsight oracle: it cannot place the accurate member between arrivals it does not know.
    The same call gives the same run."""
    gains = {"known": 0.0, "hindsight": 0.0}
    short = 0.0
    for seed in range(3):
        scenario = make_scenario(make_pattern("bursty", 2.0, 180, seed=seed), seed)
        fastest = simulate(StaticController("fast", 0), FRONT, scenario, 800)
        known = known_load_oracle(FRONT, scenario, 800, degrade_after=0.25)
        hindsight = hindsight_oracle(FRONT, scenario, 800)
        assert known.mean_accuracy > fastest.mean_accuracy + 0.02
        short += fastest.compliance - known.compliance
        gains["known"] += known.mean_accuracy - fastest.mean_accuracy
        gains["hindsight"] += hindsight.mean_accuracy - fastest.mean_accuracy
    assert short / 3 < 1.5
    assert gains["known"] < gains["hindsight"]
    again = known_load_oracle(FRONT, scenario, 800, degrade_after=0.25)
    assert again == known


def test_the_dispatch_degrade_serves_a_late_or_long_waited_request_on_the_fastest() -> None:
    dispatch = degrading_dispatch(FRONT, 800, degrade_after=0.25)
    assert dispatch(0.1, 3) == 3
    # Waited past a quarter of the SLO: on the fastest though slow's 300 ms still fits.
    assert dispatch(0.25, 3) == 0
    # Slow's median no longer fits what is left, under a quarter waited or not.
    never = degrading_dispatch(FRONT, 800, degrade_after=1.0)
    assert never(0.45, 3) == 3
    assert never(0.55, 3) == 0
    # Late whatever serves it: served (never refused) on the fastest.
    assert never(0.9, 3) == 0


def test_the_known_load_oracle_refuses_what_it_cannot_draw_again() -> None:
    trace = make_scenario(trace_pattern([0.0, 0.5, 1.0]), 0)
    with pytest.raises(SimulationError, match="pattern: a trace"):
        known_load_oracle(FRONT, trace, 800)
    scenario = make_scenario(make_pattern("constant", 1.0, 10), 0)
    with pytest.raises(SimulationError, match="worlds"):
        known_load_oracle(FRONT, scenario, 800, worlds=0)
    with pytest.raises(SimulationError, match="window_s"):
        known_load_oracle(FRONT, scenario, 800, window_s=0.0)
