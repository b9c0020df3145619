"""The hindsight oracle: the hull it mixes on, its targets, and its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from compass.domain.arrivals import SimulationError, make_pattern, make_scenario
from compass.domain.elastico import Elastico
from compass.domain.mix import Mix, accuracy_hull
from compass.domain.oracle import hindsight_oracle
from compass.domain.planner import Slo, plan_thresholds
from compass.domain.podmodel import PodModel
from compass.domain.simulator import StaticController, simulate
from compass_dev.scenarios import normal_profile as profile

FRONT = [
    profile("fast", 0.70, 100, 15),
    # Under the chord from fast to slow: a mix of those two beats it.
    profile("dull", 0.72, 180, 20),
    profile("mid", 0.85, 200, 20),
    profile("slow", 0.90, 300, 30),
]


def test_the_hull_drops_members_a_mix_of_their_neighbours_beats() -> None:
    assert accuracy_hull(FRONT) == (0, 2, 3)
    assert accuracy_hull(FRONT[:1]) == (0,)
    with pytest.raises(ValueError, match="front"):
        accuracy_hull([])


@pytest.mark.parametrize("pods", [1, 3])
def test_the_oracle_meets_static_fastest_and_gains_accuracy(pods: int) -> None:
    """Over a spike the oracle matches static fastest's compliance and is more accurate,
    serving the most accurate member when the load is light."""
    scenario = make_scenario(make_pattern("spike", 2.0 * pods, 180), 3)
    fastest = simulate(StaticController("fast", 0), FRONT, scenario, 800, pods=pods)
    oracle = hindsight_oracle(FRONT, scenario, 800, pods=pods)
    assert oracle.compliance >= fastest.compliance - 1e-9
    assert oracle.mean_accuracy > fastest.mean_accuracy + 0.05
    assert oracle.requests == fastest.requests
    assert Mix(3) in oracle.mixes
    # No member under the hull is ever served.
    assert all(1 not in (m.base, m.blend) for m in oracle.mixes)


def test_a_light_load_gets_the_most_accurate_member_in_every_window() -> None:
    scenario = make_scenario(make_pattern("constant", 0.2, 120), 1)
    oracle = hindsight_oracle(FRONT, scenario, 5000)
    assert oracle.mean_accuracy == pytest.approx(0.90)
    assert oracle.compliance == 100.0


def test_an_overload_keeps_the_oracle_on_the_fastest() -> None:
    scenario = make_scenario(make_pattern("constant", 30.0, 60), 2)
    fastest = simulate(StaticController("fast", 0), FRONT, scenario, 400)
    oracle = hindsight_oracle(FRONT, scenario, 400)
    assert oracle.compliance >= fastest.compliance
    assert oracle.mean_accuracy == pytest.approx(0.70, abs=0.01)


def test_no_strategy_beats_the_oracle_on_both_counts() -> None:
    plan = plan_thresholds(FRONT, Slo(800))
    for seed in range(3):
        scenario = make_scenario(make_pattern("bursty", 2.0, 180, seed=seed), seed)
        elastico = simulate(Elastico(plan), FRONT, scenario, 800)
        oracle = hindsight_oracle(FRONT, scenario, 800)
        assert not (
            elastico.compliance > oracle.compliance
            and elastico.mean_accuracy > oracle.mean_accuracy
        )


def test_on_late_last_queues_the_oracle_meets_static_fastest_there_and_bounds_elastico() -> None:
    """With late-last queues (static fastest's too) the oracle keeps static fastest's compliance
    on them, gains accuracy, and Elastico on the same queues does not beat it on both."""
    plan = plan_thresholds(FRONT, Slo(500))
    late = PodModel(late_after_s=0.4)
    for seed in range(3):
        scenario = make_scenario(make_pattern("spike", 2.5, 180, seed=seed), seed)
        fastest = simulate(StaticController("fast", 0), FRONT, scenario, 500, pod_model=late)
        fifo = hindsight_oracle(FRONT, scenario, 500)
        oracle = hindsight_oracle(FRONT, scenario, 500, late_after_s=0.4)
        elastico = simulate(Elastico(plan), FRONT, scenario, 500, pod_model=late)
        assert oracle.compliance >= fastest.compliance - 1e-9
        assert oracle.compliance > fifo.compliance
        assert oracle.mean_accuracy > fastest.mean_accuracy + 0.02
        assert not (
            elastico.compliance > oracle.compliance
            and elastico.mean_accuracy > oracle.mean_accuracy
        )


@pytest.mark.parametrize("window", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_window_is_named(window: float) -> None:
    scenario = make_scenario(make_pattern("constant", 1.0, 10), 0)
    with pytest.raises(SimulationError, match="window_s"):
        hindsight_oracle(FRONT, scenario, 800, window_s=window)


def test_windows_partition_the_requests() -> None:
    scenario = make_scenario(make_pattern("step", 2.0, 100), 5)
    oracle = hindsight_oracle(FRONT, scenario, 800, window_s=10.0)
    assert len(oracle.mixes) == int(np.floor(scenario.arrivals_s.max() / 10.0)) + 1
