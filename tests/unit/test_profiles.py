"""Latency profiles: time scaling and the screening rule that spares precise measurements."""

from __future__ import annotations

import pytest

from compass.conversion import front_entry, latency_profile
from compass.domain.planner import Slo, plan_from_profiles
from compass.domain.profiles import (
    LatencyProfile,
    ProfileError,
    clearly_dominated,
    parse_profiles,
)
from compass_dev.scenarios import scaled_profile


def test_an_as_accurate_and_clearly_faster_configuration_dominates() -> None:
    screened = [(0.80, 100.0), (0.78, 130.0), (0.85, 200.0), (0.84, 300.0)]
    # 1: 0 is more accurate and 30% faster. 3: 2 is more accurate and 50% faster.
    assert clearly_dominated(screened, margin=0.25) == {1, 3}


def test_the_margin_keeps_near_ties_of_noisy_screenings() -> None:
    screened = [(0.80, 100.0), (0.79, 120.0), (0.80, 110.0)]
    assert clearly_dominated(screened, margin=0.25) == set()
    assert clearly_dominated(screened, margin=0.05) == {1, 2}


def test_equal_accuracy_drops_only_the_slower_one() -> None:
    assert clearly_dominated([(0.8, 100.0), (0.8, 200.0)], margin=0.25) == {1}


def test_unknown_accuracy_is_never_dropped_and_drops_nothing() -> None:
    screened: list[tuple[float | None, float]] = [(None, 50.0), (0.7, 500.0), (None, 900.0)]
    assert clearly_dominated(screened, margin=0.25) == set()


def test_front_members_are_never_screened_out() -> None:
    """Whatever screening drops is also off the Pareto front built from the same numbers."""
    means = [120.0, 150.0, 160.0, 210.0, 260.0, 400.0, 330.0, 300.0, 420.0]
    accuracies = [0.70, 0.76, 0.74, 0.80, 0.79, 0.86, 0.85, 0.72, 0.78]
    profiles = [
        LatencyProfile({"k": i}, a, m, m * 1.2)
        for i, (a, m) in enumerate(zip(accuracies, means, strict=True))
    ]
    plan = plan_from_profiles(profiles, Slo(5000.0, 95.0), 50.0)
    on_front = {int(t.profile.config["k"]) for t in plan.thresholds}
    dropped = clearly_dominated(list(zip(accuracies, means, strict=True)), margin=0.25)
    assert dropped == {7, 8}
    assert not dropped & on_front


def test_scaled_multiplies_every_time_and_keeps_the_rest() -> None:
    profile = LatencyProfile({"k": 1}, 0.8, 100.0, 150.0, p50_ms=90.0, p99_ms=200.0, std_ms=20.0)
    half = scaled_profile(profile, 0.5)
    assert (half.mean_ms, half.p95_ms, half.p50_ms, half.p99_ms, half.std_ms) == (
        50.0,
        75.0,
        45.0,
        100.0,
        10.0,
    )
    assert (half.config, half.accuracy) == (profile.config, profile.accuracy)
    assert half.distribution.quantile(0.9) == pytest.approx(profile.distribution.quantile(0.9) / 2)
    assert scaled_profile(profile, 1.0) == profile


def test_scaling_leaves_missing_percentiles_missing() -> None:
    half = scaled_profile(LatencyProfile({"k": 1}, 0.8, 100.0, 150.0), 0.5)
    assert (half.p50_ms, half.p99_ms, half.std_ms) == (None, None, None)


def test_only_the_given_entries_may_dominate() -> None:
    screened = [(0.80, 100.0), (0.80, 200.0), (0.79, 300.0)]
    assert clearly_dominated(screened, margin=0.25) == {1, 2}
    # 0 is not trusted to dominate: only 1 may, and it beats 2 only.
    assert clearly_dominated(screened, margin=0.25, by={1}) == {2}
    assert clearly_dominated(screened, margin=0.25, by=set()) == set()


def test_component_times_are_read_checked_scaled_and_carried_by_the_front() -> None:
    entry = {
        "config": {"k": 1},
        "accuracy": 0.8,
        "latency_mean_ms": 100.0,
        "latency_p95_ms": 150.0,
        "component_ms": {"retriever": 20, "generator": 70.5},
    }
    (profile,) = parse_profiles([entry])
    assert profile.component_ms == {"retriever": 20.0, "generator": 70.5}
    assert scaled_profile(profile, 0.5).component_ms == {"retriever": 10.0, "generator": 35.25}
    # The ParetoPolicy's front entry keeps them, and its profile is the same again.
    assert latency_profile(front_entry(profile)) == profile
    assert (
        parse_profiles([{k: v for k, v in entry.items() if k != "component_ms"}])[0].component_ms
        is None
    )


@pytest.mark.parametrize(
    ("times", "message"),
    [
        ([20.0], "profiles\\[0\\].component_ms: \\[20.0\\] is not an object of model: ms"),
        ({}, "is not an object of model: ms"),
        ({"generator": "70"}, "profiles\\[0\\].component_ms.generator: '70' is not a number"),
        ({"generator": -1.0}, "component_ms.generator: -1 is negative"),
        ({f"m{i}": 1.0 for i in range(17)}, "17 component models; give at most 16"),
    ],
)
def test_bad_component_times_name_the_field(times: object, message: str) -> None:
    entry = {
        "config": {"k": 1},
        "accuracy": 0.8,
        "latency_mean_ms": 100.0,
        "latency_p95_ms": 150.0,
        "component_ms": times,
    }
    with pytest.raises(ProfileError, match=message):
        parse_profiles([entry])
