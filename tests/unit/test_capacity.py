"""Capacity under concurrency: curves, the ladder, Erlang C, pods of several servers and stages,
and the planner's concurrent models."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError

from compass.api.paretopolicy import CapacitySpec, ParetoPolicySpec
from compass.conversion import front_entry, latency_profile, policy_plan
from compass.dataplane.profiler import CurveSettings
from compass.domain.arrivals import SimulationError, make_pattern, make_scenario
from compass.domain.capacity import (
    LADDER_FINEST,
    LADDER_FLOOR,
    LADDER_GROWTH,
    LADDER_START,
    MAX_CURVE_POINTS,
    MIN_REQUESTS_PER_RATE,
    NEAR_CAPACITY,
    CapacityCurve,
    CapacityError,
    CurvePoint,
    climb_ladder,
    erlang_c,
    heavy_traffic_rate,
    measure_point,
    median_point,
    next_rate,
    parse_curve,
)
from compass.domain.planner import PlanError, Slo, ThresholdModel, plan_thresholds
from compass.domain.podmodel import RAG_SIM_STAGES, PodModel, Stage
from compass.domain.profiles import LatencyProfile, ProfileError, parse_profile
from compass.domain.simulator import StaticController, simulate
from compass_dev.scenarios import normal_profile, scaled_curve
from compass_dev.sim_capacity import measure_capacity

FAST = normal_profile("fast", 0.7, 100, 15)


def point(rate: float, p95: float, throughput: float | None = None) -> CurvePoint:
    """A curve point whose percentiles are spread around ``p95``."""
    return CurvePoint(
        rate,
        rate if throughput is None else throughput,
        p95 * 0.7,
        ((50, p95 * 0.6), (95, p95), (99, p95 * 1.3)),
    )


def exponential(mean: float) -> LatencyProfile:
    """A profile of exponential service times (M/M/c when served by c servers)."""
    return LatencyProfile(
        {"c": "exp"},
        0.5,
        mean,
        mean * math.log(20),
        p50_ms=mean * math.log(2),
        p99_ms=mean * math.log(100),
        std_ms=mean,
    )


# ------------------------------------------------------------------------------- Erlang C


def test_erlang_c_matches_the_textbook_values() -> None:
    """C(1, a) = a; C(2, 1) = 1/3; the probability grows with the load and hits 1 at c."""
    assert erlang_c(1, 0.6) == pytest.approx(0.6)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    loads = [erlang_c(4, a) for a in (0.5, 1.5, 2.5, 3.5)]
    assert loads == sorted(loads)
    assert erlang_c(4, 4.0) == 1.0
    assert erlang_c(4, 0.0) == 0.0


def test_simulated_independent_servers_wait_as_often_as_erlang_c_says() -> None:
    """Four independent servers in the simulator: P(wait) is Erlang C's at the load served.

    The fitted distribution is exponential-like, not exponential (its lower tail is clipped at
    0), so the load is the rate times the mean service time the run actually drew.
    """
    profile = exponential(100)
    rate = 30.0  # about 3 busy servers of 4
    waited, loads = [], []
    for seed in range(3):
        scenario = make_scenario(make_pattern("constant", rate, 600), seed)
        report = simulate(
            StaticController(profile.name, 0), [profile], scenario, 1000, pod_model=PodModel(4)
        )
        waited.append(np.mean((report.starts_s - report.arrivals_s)[1000:] > 1e-9))
        loads.append(rate * np.mean(report.finishes_s - report.starts_s))
    assert np.mean(waited) == pytest.approx(erlang_c(4, float(np.mean(loads))), abs=0.03)
    assert erlang_c(4, float(np.mean(loads))) > 0.5


# ----------------------------------------------------------------------------- the curve


def test_max_rate_interpolates_where_the_percentile_crosses_the_budget() -> None:
    """Linear between rates (from the idle percentile at 0); nothing claimed past the curve."""
    curve = CapacityCurve(1, (point(2, 200), point(4, 400), point(6, 800)))
    assert curve.max_rate(300, 95, idle_ms=100) == pytest.approx(3.0)
    assert curve.max_rate(150, 95, idle_ms=100) == pytest.approx(1.0)
    assert curve.max_rate(5000, 95, idle_ms=100) == 6.0
    assert curve.max_rate(90, 95, idle_ms=100) == 0.0


def test_max_rate_ignores_saturated_rates_and_noise_that_falls() -> None:
    """A saturated rate's latency is not read (only its drain rate); a dip from noise is
    pooled, not read as a crossing."""
    saturated = CapacityCurve(1, (point(2, 200), point(4, 250, throughput=3.0)))
    # Past 2/s the queueing it showed (100 ms at rho 2/3) grows as rho / (1 - rho) on the 3/s
    # drain rate: 200 ms at rho 0.8, whatever the saturated run's 250 ms said.
    assert saturated.max_rate(300, 95, idle_ms=100) == pytest.approx(2.4)
    noisy = CapacityCurve(1, (point(2, 320), point(3, 280), point(4, 600)))
    # Pooled: 300 at rates 2 and 3, so the budget of 300 holds up to rate 3.
    assert noisy.max_rate(300, 95, idle_ms=100) == pytest.approx(3.0)


def test_rates_at_capacity_or_still_growing_are_not_read_for_latency() -> None:
    """A finite run just short of the drain rate, or one whose latency still grew, is no
    steady state: the crossing is read below it."""
    near = CapacityCurve(
        1, (point(2, 200), point(4, 400), point(7.9, 600), point(9, 5000, throughput=8))
    )
    assert [p.offered_qps for p in near.steady_points()] == [2, 4]
    # From 4/s (rho 0.5 of the 8/s drain, 300 ms of queueing) to 600 ms: rho 2/3.
    assert near.max_rate(700, 95, idle_ms=100) == pytest.approx(16 / 3)
    growing = replace(point(4, 400), growing=True)
    assert growing.saturated
    assert parse_curve(CapacityCurve(1, (point(2, 200), growing)).to_json(), "c").points[1].growing
    arrivals = np.arange(100.0)
    queue = measure_point(1.0, arrivals, arrivals + np.linspace(0.1, 0.6, 100))
    assert queue.growing
    assert queue.saturated


def test_a_fast_configurations_latency_doubling_is_no_queue() -> None:
    """At 600/s a 5 ms reply reading 12 ms at the end of a 30 s run is noise: a queue that
    piled up only 7 ms in 20 s would be a pod 0.04% behind. A wait that grows by 1.5% of the
    elapsed time is one."""
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0.0, 30.0, 18_000))
    drift = np.where(arrivals > 24.0, 0.012, 0.005)
    noisy = measure_point(600.0, arrivals, arrivals + drift * rng.uniform(0.8, 1.2, len(arrivals)))
    assert not noisy.growing
    assert not noisy.saturated
    behind = arrivals + 0.005 + 0.015 * np.maximum(arrivals - 6.0, 0.0)
    assert measure_point(600.0, arrivals, behind).growing


# qa-real's lexical configuration at c = 4, measured live (rate, throughput, p95 ms): steady up
# to 613.9/s, collapsed at 661.7/s, where the overloaded pod (client and server on two shared
# cores) drained only 592.3/s, less than it had served steadily.
LEXICAL = (
    (84.13, 84.04, 5.6),
    (125.93, 125.89, 5.6),
    (183.92, 183.85, 6.9),
    (286.91, 286.75, 9.3),
    (354.61, 354.36, 8.4),
    (383.16, 383.02, 8.1),
    (436.72, 436.04, 27.4),
    (552.72, 552.42, 16.3),
    (613.92, 613.72, 12.6),
    (661.71, 592.26, 1506.4),
)


def test_the_drain_rate_comes_from_saturated_points_only() -> None:
    """A steady point's throughput is the rate it was offered, not what the pod drains."""
    curve = CapacityCurve(4, tuple(point(r, p95, throughput=t) for r, t, p95 in LEXICAL))
    assert curve.saturated
    assert curve.saturation_qps == pytest.approx(592.26)
    assert curve.holding_ms() == pytest.approx(4 / 592.26 * 1000)
    never = CapacityCurve(4, (point(2, 200), point(4, 400, throughput=3.9)))
    # Never saturated: the highest throughput is a lower bound, and nothing is near it.
    assert not never.saturated
    assert never.saturation_qps == pytest.approx(3.9)
    assert not never.capacity_known()
    assert never.steady_points() == list(never.points)


def test_a_steady_point_just_below_a_collapse_is_read() -> None:
    """Served steadily faster than the overloaded pod drains: the drain rate is no capacity
    that point is near, so the planner claims up to it (it claimed 552.7/s, 10% short)."""
    curve = CapacityCurve(4, tuple(point(r, p95, throughput=t) for r, t, p95 in LEXICAL))
    assert curve.max_rate(250, 95, idle_ms=5.0) == pytest.approx(613.92)
    assert curve.steady_points()[-1].offered_qps == 613.92
    assert not curve.capacity_known()
    # Nor past the collapse: a run above it that stayed steady is luck, not capacity.
    lucky = replace(curve, points=(*curve.points, point(700.0, 15.0)))
    assert lucky.max_rate(250, 95, idle_ms=5.0) == pytest.approx(613.92)
    # Where the drain rate is the capacity (served no slower than the steady rates), the
    # guard stays: 613.9/s is within 3% of a 620/s drain rate, a random walk's reading, and
    # the claim past 552.7/s stops there too.
    consistent = replace(curve, points=(*curve.points[:-1], point(661.71, 1506.4, 620.0)))
    assert consistent.capacity_known()
    assert consistent.steady_points()[-1].offered_qps == 552.72
    assert consistent.max_rate(250, 95, idle_ms=5.0) == pytest.approx(NEAR_CAPACITY * 620.0)


def test_the_ladder_refines_the_knee_of_a_pod_that_slows_when_overloaded() -> None:
    """Steady up to 10/s, and past it a drain of 9/s: the ladder halves the gap between the last
    rate the planner reads and the first saturated one down to ``LADDER_FINEST``, and the
    planner's rate is within that of the collapse."""

    def run(rate: float) -> CurvePoint:
        if rate >= 10:
            return point(rate, 5000, throughput=9.0)
        return point(rate, 100 * (1 + rate / 10))

    curve = climb_ladder(100, 1, run, idle_p95_ms=100)
    assert len(curve.points) <= MAX_CURVE_POINTS
    last = curve.steady_points()[-1].offered_qps
    first_saturated = next(p.offered_qps for p in curve.points if p.saturated)
    assert first_saturated / last <= LADDER_FINEST
    assert curve.max_rate(1000, 95, idle_ms=100) == last
    assert last >= 10 / LADDER_FINEST


def test_percentiles_between_stored_levels_are_interpolated_in_normal_score() -> None:
    """p90 lies between p50 and p95, closer to p95; below p50 and above p99 they clamp."""
    sample = point(1, 100)
    assert 60 < sample.latency_at(90) < 100
    assert sample.latency_at(90) > (60 + 100) / 2
    assert sample.latency_at(10) == 60
    assert sample.latency_at(99.9) == 130


def test_measure_point_leaves_out_the_warm_up_and_counts_throughput() -> None:
    """Latencies from the steady part; throughput over the whole run; the realised rate."""
    arrivals = np.arange(10.0)
    finishes = arrivals + np.array([0.01, 0.01] + [0.1] * 8)
    measured = measure_point(1.0, arrivals, finishes)
    assert measured.latency_at(50) == pytest.approx(100)
    assert measured.offered_qps == pytest.approx(1.0)  # what the arrivals realised
    assert measured.throughput_qps == pytest.approx(9 / 9.1)
    assert not measured.saturated
    late = measure_point(1.0, arrivals, arrivals + np.linspace(0.1, 3.0, 10))
    assert late.saturated


def test_curves_scale_times_up_and_rates_down() -> None:
    """A time-scaled replay: a curve at half speed serves half the rate at twice the latency."""
    curve = CapacityCurve(2, (point(2, 200), point(4, 400)))
    slow = scaled_curve(curve, 2.0)
    assert slow.points[1].offered_qps == 2.0
    assert slow.points[1].latency_at(95) == 800
    assert slow.max_rate(600, 95, idle_ms=200) == pytest.approx(curve.max_rate(300, 95, 100) / 2)


# ---------------------------------------------------------------------------- the ladder


def test_ladder_climbs_to_saturation_then_fills_in_where_latency_bends() -> None:
    """Below its first rate it halves until the p95 is near the one-at-a-time one; then rates
    grow until one saturates; then midpoints go where the p95 rises most, until every gap is
    narrow or flat (a line across a flat stretch is already right)."""
    capacity = 10.0

    def run(rate: float) -> CurvePoint:
        return point(rate, 100 / max(1 - rate / capacity, 0.01), min(rate, capacity))

    points: list[CurvePoint] = []
    while (rate := next_rate(points, mean_ms=100, idle_p95_ms=100)) is not None:
        points.append(run(rate))
    ordered = sorted(points, key=lambda p: p.offered_qps)
    assert points[0].offered_qps == pytest.approx(2.5)
    # 133 ms at 2.5/s, 114 at 1.25/s, 107 at 0.625/s: within LADDER_FINEST of 100 ms idle.
    assert [p.offered_qps for p in points[1:3]] == pytest.approx([1.25, 0.625])
    assert ordered[0].latency_at(95) <= LADDER_FINEST * 100 < ordered[1].latency_at(95)
    assert any(p.saturated for p in points)
    assert len(points) <= MAX_CURVE_POINTS
    first_saturated = next(i for i, p in enumerate(ordered) if p.saturated)
    below = ordered[: first_saturated + 1]
    # The knee got the finest steps: the last gap before saturation is the narrowest.
    ratios = [b.offered_qps / a.offered_qps for a, b in itertools.pairwise(below)]
    assert ratios[-1] == min(ratios)
    if len(points) < MAX_CURVE_POINTS:
        for low, high in itertools.pairwise(below[:-1]):
            wide = high.offered_qps / low.offered_qps > LADDER_FINEST
            assert not wide or high.latency_at(95) / low.latency_at(95) <= LADDER_FINEST


def test_ladder_halves_a_gap_up_to_a_rate_too_near_capacity_to_read() -> None:
    """A steady rate within ``NEAR_CAPACITY`` of the drain rate is not read by the planner, so
    the gap below it is the knee, however flat its p95 looks; and a first rate too near to read
    climbs down."""
    points = [point(5, 100), point(9.8, 105), point(11, 5000, throughput=10)]
    assert [p.offered_qps for p in CapacityCurve(1, tuple(points)).steady_points()] == [5]
    assert next_rate(points, 100, idle_p95_ms=100) == pytest.approx(7.4)
    assert next_rate(points[1:], 100, idle_p95_ms=100) == pytest.approx(9.8 / 1.5)


def test_ladder_climbs_down_below_a_steep_first_rate_no_further_than_its_floor() -> None:
    """A p95 twice the one-at-a-time one at every rate: the ladder halves its first rate down
    to ``LADDER_FLOOR`` of one server's capacity, then climbs as usual."""
    first = LADDER_START * 10
    points = [point(first, 200)]
    while (rate := next_rate(points, 100, idle_p95_ms=100)) is not None and rate < first:
        points.append(point(rate, 200))
    assert [p.offered_qps for p in points] == pytest.approx(
        [first, first / 2, first / 4, first / 8]
    )
    assert first / 16 < LADDER_FLOOR * 10 <= first / 8
    assert rate == pytest.approx(first * LADDER_GROWTH)


def test_ladder_climbs_down_when_its_first_rate_saturates() -> None:
    """A pod slower than one server's profile saturates at once: the next rate is lower."""
    first = next_rate([], mean_ms=100, idle_p95_ms=100)
    assert first is not None
    saturated = [point(first, 900, throughput=first / 3)]
    assert next_rate(saturated, 100, idle_p95_ms=100) == pytest.approx(first / 1.5)


def test_ladder_respects_its_budget() -> None:
    """No more than ``max_points`` rates."""
    points = [point(1.0 + i, 100) for i in range(5)]
    assert next_rate(points, 100, max_points=5, idle_p95_ms=100) is None


def test_repeated_runs_at_a_rate_give_the_run_of_median_p95() -> None:
    """A busy moment's run and a quiet one's are both outvoted; the point is one whole run."""
    quiet, usual, busy = point(10, 150), point(10.2, 180, throughput=10.1), point(9.9, 900)
    assert median_point([busy, quiet, usual]) is usual
    assert median_point([busy, quiet]) is quiet
    assert median_point([usual]) is usual
    with pytest.raises(CapacityError, match="runs"):
        median_point([])


def test_each_rate_offers_its_requests_within_the_time_bounds() -> None:
    """The count between the bounds, at least 10 s at a fast rate, at most 60 s at a slow one,
    and never so few that a p95 is one slow reply."""
    settings = CurveSettings(requests_per_rate=300, seconds_per_rate=10.0, max_seconds_per_rate=60)
    assert settings.requests_at(10.0) == 300
    assert settings.requests_at(100.0) == 1000
    assert settings.requests_at(0.7) == 42
    assert settings.requests_at(0.1) == MIN_REQUESTS_PER_RATE


# ---------------------------------------------------------------------------- parsing


def test_a_curve_round_trips_through_json() -> None:
    curve = CapacityCurve(4, (point(2, 200), point(4, 400)))
    assert parse_curve(curve.to_json(), "capacity") == curve


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"servers": 0}, "capacity.servers"),
        ({"servers": True}, "capacity.servers"),
        ({"points": []}, "capacity.points"),
        ({"points": [{"offered_qps": 1}] * (MAX_CURVE_POINTS + 1)}, "capacity.points"),
    ],
)
def test_bad_curves_name_the_field(change: dict[str, object], field: str) -> None:
    entry = {**CapacityCurve(1, (point(2, 200),)).to_json(), **change}
    with pytest.raises(ValueError, match=f"^{field}:"):
        parse_curve(entry, "capacity")


def test_bad_points_name_the_field() -> None:
    good = CapacityCurve(1, (point(2, 200), point(4, 400))).to_json()
    swapped = {**good, "points": good["points"][::-1]}
    with pytest.raises(ValueError, match=r"capacity.points\[1\].offered_qps: .* ascending"):
        parse_curve(swapped, "capacity")
    broken = {**good, "points": [{**good["points"][0], "latency_p99_ms": 1.0}]}
    with pytest.raises(ValueError, match=r"points\[0\].latency_p99_ms: .* below"):
        parse_curve(broken, "capacity")
    missing = {**good, "points": [{**good["points"][0], "throughput_qps": "x"}]}
    with pytest.raises(ValueError, match=r"points\[0\].throughput_qps: 'x' is not a number"):
        parse_curve(missing, "capacity")


def test_a_profile_carries_its_curve_and_names_its_errors() -> None:
    """``capacity`` in a profiles file entry; a bad one is a ProfileError under the entry."""
    curve = CapacityCurve(4, (point(2, 200), point(4, 400)))
    entry = {
        "config": {"c": "fast"},
        "accuracy": 0.7,
        "latency_mean_ms": 100.0,
        "latency_p95_ms": 125.0,
        "capacity": curve.to_json(),
    }
    assert parse_profile(entry, "profiles[0]").capacity == curve
    with pytest.raises(ProfileError, match=r"^profiles\[0\].capacity.servers:"):
        parse_profile({**entry, "capacity": {**curve.to_json(), "servers": -1}}, "profiles[0]")


# ------------------------------------------------------------------------ pods in the simulator


def test_pod_models_are_checked() -> None:
    with pytest.raises(SimulationError, match=r"^servers:"):
        PodModel(0)
    with pytest.raises(SimulationError, match=r"^stages: the shares add up to 0\.5"):
        PodModel(2, (Stage(0.5),))
    with pytest.raises(SimulationError, match=r"^stages:"):
        PodModel(2, (Stage(1.0, max_batch=0),))


def test_a_batch_takes_its_longest_request_times_the_batch_cost() -> None:
    """Two requests at once into one batching stage finish together, 1.5 x the longer one."""
    assert Stage(1.0, max_batch=4, batch_cost=0.5).batch_time([0.1, 0.2]) == pytest.approx(0.3)
    profile = normal_profile("one", 0.5, 100, 1e-6)
    scenario = make_scenario(make_pattern("constant", 1.0, 1.0), 0)
    arrivals = np.array([0.0, 0.0])
    scenario = replace(scenario, arrivals_s=arrivals, luck=np.array([0.5, 0.5]))
    pod = PodModel(2, (Stage(1.0, max_batch=2, batch_cost=0.5),))
    report = simulate(StaticController(profile.name, 0), [profile], scenario, 1000, pod_model=pod)
    assert report.finishes_s.tolist() == pytest.approx([0.15, 0.15])
    alone = PodModel(2, (Stage(1.0),))
    one_at_a_time = simulate(
        StaticController(profile.name, 0), [profile], scenario, 1000, pod_model=alone
    )
    assert sorted(one_at_a_time.finishes_s.tolist()) == pytest.approx([0.1, 0.2])


def test_stages_at_one_server_serve_the_profiled_time() -> None:
    """One router instance through stages whose shares add to 1: the same latencies as none."""
    scenario = make_scenario(make_pattern("spike", 3.0, 120), 4)
    plain = simulate(StaticController(FAST.name, 0), [FAST], scenario, 500)
    staged = simulate(
        StaticController(FAST.name, 0), [FAST], scenario, 500, pod_model=PodModel(1, RAG_SIM_STAGES)
    )
    assert staged.finishes_s == pytest.approx(plain.finishes_s)


def test_pipelined_stages_serve_more_than_one_server_and_less_than_ideal_ones() -> None:
    """rag-sim's pipeline at c = 4 saturates between 1 / mean and 4 / mean; batching helps."""
    ideal = measure_capacity(FAST, PodModel(4), requests=400).saturation_qps
    piped = measure_capacity(FAST, PodModel(4, RAG_SIM_STAGES), requests=400).saturation_qps
    unbatched = PodModel(4, tuple(replace(stage, max_batch=1) for stage in RAG_SIM_STAGES))
    serial = measure_capacity(FAST, unbatched, requests=400).saturation_qps
    one = 1000 / FAST.mean_ms
    assert one < serial < piped < ideal
    assert serial == pytest.approx(one / 0.7, rel=0.1)  # the generator's share is the bottleneck
    assert ideal == pytest.approx(4 * one, rel=0.1)


def long_run_p95(pod: PodModel, rate: float, requests: int) -> float:
    """FAST's p95 (ms) over a long constant run at ``rate``, past its first fifth (warm-up)."""
    scenario = make_scenario(make_pattern("constant", rate, requests / rate), 11)
    report = simulate(StaticController(FAST.name, 0), [FAST], scenario, math.inf, pod_model=pod)
    return float(np.percentile(report.latencies_ms[requests // 5 :], 95))


def test_the_measured_curve_predicts_where_a_long_run_crosses_the_slo() -> None:
    """The plan's rate limit from the curve is within 15% of a long run's p95 crossing."""
    pod = PodModel(4, RAG_SIM_STAGES)
    measured = replace(FAST, capacity=measure_capacity(FAST, pod, seed=0, requests=1000))
    plan = plan_thresholds([measured], Slo(400), 0, ThresholdModel.MEASURED, servers=4)
    predicted = plan.thresholds[0].stay_max_qps
    assert predicted is not None

    def p95(rate: float) -> float:
        return long_run_p95(pod, rate, 4000)

    assert p95(predicted * 0.85) <= 400 < p95(predicted * 1.15)


def test_a_budget_below_the_first_rates_p95_is_read_off_rates_measured_below_it() -> None:
    """One near-deterministic server (c = 1) and a budget 1.4 times its one-at-a-time p95: the
    p95 jumps once 5% of arrivals wait, so the line from rate 0 to the ladder's first rate
    claims more than 15% past a long run's crossing; the rates the ladder measured below its
    first one put the plan's limit within 15% of it."""
    pod = PodModel(1)
    curve = measure_capacity(FAST, pod, seed=0, requests=1000)
    idle = FAST.latency_at(95)
    budget = 1.4 * idle
    first = LADDER_START * 1000 / FAST.mean_ms
    assert curve.points[0].offered_qps < first / 2
    predicted = curve.max_rate(budget, 95, idle)
    line = replace(curve, points=tuple(p for p in curve.points if p.offered_qps > 0.9 * first))
    claimed = line.max_rate(budget, 95, idle)

    def p95(rate: float) -> float:
        return long_run_p95(pod, rate, 8000)

    assert p95(predicted * 0.85) <= budget < p95(predicted * 1.15)
    assert p95(claimed * 0.85) > budget


def test_with_a_known_capacity_rates_between_points_are_read_in_heavy_traffic_terms() -> None:
    """Linear in rho / (1 - rho), not in the rate: across a wide gap below the knee the line in
    the rate claims far less than the queue allows (4.6/s here, against 6.5/s)."""
    curve = CapacityCurve(1, (point(2, 150), point(8, 500), point(12, 5000, throughput=10.0)))
    assert curve.capacity_known()
    # rho / (1 - rho): 0.25 at 2/s, 4 at 8/s; 300 ms is 3/7 of the way from 150 to 500.
    x = 0.25 + 3 / 7 * (4 - 0.25)
    assert curve.max_rate(300, 95, idle_ms=100) == pytest.approx(10 * x / (1 + x))
    unknown = CapacityCurve(1, curve.points[:2])
    assert unknown.max_rate(300, 95, idle_ms=100) == pytest.approx(2 + 3 / 7 * 6)


def test_heavy_traffic_scaling_past_the_last_steady_rate() -> None:
    """Queueing grows as rho / (1 - rho): twice the delay at rho 0.5 is rho 2/3; it never
    claims past NEAR_CAPACITY of the drain rate, nor past a rate that queued nothing."""
    assert heavy_traffic_rate(5.0, 100.0, 200.0, 10.0) == pytest.approx(20 / 3)
    assert heavy_traffic_rate(5.0, 100.0, 1e9, 10.0) == pytest.approx(NEAR_CAPACITY * 10)
    assert heavy_traffic_rate(5.0, 0.0, 200.0, 10.0) == 5.0
    assert heavy_traffic_rate(9.9, 100.0, 200.0, 10.0) == pytest.approx(NEAR_CAPACITY * 10)


@pytest.mark.parametrize("pod", [PodModel(1), PodModel(4, RAG_SIM_STAGES)], ids=["c1", "c4"])
def test_a_budget_past_the_curve_is_met_near_where_a_long_run_crosses_it(pod: PodModel) -> None:
    """A coarse curve (read up to 80% of the drain rate, as a noisy ladder may end) and an SLO
    above every p95 it read: the rate claimed past its last steady rate is within 15% of a long
    run's crossing, where that last rate alone falls more than 15% short."""
    full = measure_capacity(FAST, pod, seed=0, requests=1000)
    drain = full.saturation_qps
    coarse = CapacityCurve(
        pod.servers,
        tuple(p for p in full.points if p.saturated or p.offered_qps <= 0.8 * drain),
    )
    last = coarse.steady_points()[-1]
    budget = 3 * last.latency_at(95)
    predicted = coarse.max_rate(budget, 95, FAST.latency_at(95))

    def p95(rate: float) -> float:
        return long_run_p95(pod, rate, 8000)

    assert p95(predicted * 0.85) <= budget < p95(predicted * 1.15)
    assert p95(last.offered_qps * 1.15) <= budget


# --------------------------------------------------------------------------- the planner


def test_erlang_c_agrees_with_the_mg1_tail_at_one_server_and_scales_with_servers() -> None:
    """At c = 1 the two analytic models are within a few percent; at c = 4 about 4x the rate."""
    one = plan_thresholds([FAST], Slo(400), 50, ThresholdModel.ERLANG_C).thresholds[0]
    tail = plan_thresholds([FAST], Slo(400), 50, ThresholdModel.TAIL).thresholds[0]
    four = plan_thresholds([FAST], Slo(400), 50, ThresholdModel.ERLANG_C, servers=4).thresholds[0]
    assert one.stay_max_qps == pytest.approx(tail.stay_max_qps, rel=0.05)
    assert one.stay_max_queue == tail.stay_max_queue
    assert four.stay_max_qps is not None
    assert one.stay_max_qps is not None
    assert 3.5 * one.stay_max_qps < four.stay_max_qps < 4 * 1000 / FAST.mean_ms
    assert one.stay_max_queue is not None
    assert four.stay_max_queue is not None
    assert four.stay_max_queue >= 4 * one.stay_max_queue


def test_the_paper_models_ignore_servers() -> None:
    """paper-mean and tail describe one sequential server, whatever the pod runs."""
    for model in (ThresholdModel.PAPER_MEAN, ThresholdModel.TAIL):
        one = plan_thresholds([FAST], Slo(400), 50, model).thresholds[0]
        four = plan_thresholds([FAST], Slo(400), 50, model, servers=4).thresholds[0]
        assert one == four


def test_the_measured_model_reads_the_curve_and_falls_back_to_erlang_c() -> None:
    """With a curve its limits come from it; a member without one gets the M/G/c limits."""
    curve = CapacityCurve(2, (point(5, 200), point(10, 300), point(15, 900), point(20, 5000, 16)))
    measured = replace(FAST, capacity=curve)
    other = normal_profile("other", 0.8, 150, 20)
    plan = plan_thresholds([measured, other], Slo(500), 50, ThresholdModel.MEASURED, servers=2)
    fallback = plan_thresholds([other], Slo(500), 50, ThresholdModel.ERLANG_C, servers=2)
    assert plan.thresholds[0].stay_max_qps == pytest.approx(
        curve.max_rate(500, 95, FAST.latency_at(95))
    )
    assert plan.thresholds[1] == replace(fallback.thresholds[0])
    # The queue drains at the measured 16 requests/s: (N / 2 + 1) x 125 ms plus the spread.
    assert plan.thresholds[0].stay_max_queue == 5


def test_a_curve_measured_at_other_servers_is_refused() -> None:
    measured = replace(FAST, capacity=CapacityCurve(1, (point(5, 200),)))
    with pytest.raises(PlanError, match=r"^capacity\.servers: .* measured at 1 .* serves 4"):
        plan_thresholds([measured], Slo(500), 50, ThresholdModel.MEASURED, servers=4)
    with pytest.raises(PlanError, match=r"^servers:"):
        plan_thresholds([FAST], Slo(500), 50, ThresholdModel.ERLANG_C, servers=0)


# ------------------------------------------------------------------------------ the API


def test_a_front_entry_carries_the_curve_to_the_plan() -> None:
    """A ParetoPolicy front entry keeps the curve; routerInstances is the plan's servers."""
    curve = CapacityCurve(2, (point(5, 200), point(10, 300), point(15, 900)))
    measured = replace(FAST, capacity=curve)
    entry = front_entry(measured)
    assert latency_profile(entry) == measured
    wire = {
        "front": [entry.model_dump(by_alias=True, exclude_none=True)],
        "slo": {"latencyMs": 500},
        "thresholdModel": "measured",
        "routerInstances": 2,
    }
    plan = policy_plan(ParetoPolicySpec.model_validate(wire))
    assert plan.servers == 2
    assert plan.thresholds[0].stay_max_qps == pytest.approx(
        curve.max_rate(500, 95, FAST.latency_at(95))
    )
    with pytest.raises(PlanError, match=r"^capacity\.servers"):
        policy_plan(ParetoPolicySpec.model_validate({**wire, "routerInstances": 4}))


def test_a_front_entry_refuses_a_curve_out_of_order() -> None:
    good = CapacityCurve(1, (point(2, 200), point(4, 400))).to_json()
    with pytest.raises(ValidationError, match=r"points\[1\]\.offered_qps: .* not above"):
        CapacitySpec.model_validate({**good, "points": good["points"][::-1]})


def test_the_profiling_spec_sets_each_curve_rates_length() -> None:
    """curveMinSecondsPerRate lengthens a fast rate's run (30 s at 600/s: 18,000 requests);
    curveMaxSecondsPerRate still caps a slow one, and wins where the two disagree."""
    from compass.api.compoundworkflow import Profiling
    from compass.commands.job_profile import curve_settings

    default = curve_settings(Profiling())
    assert default.requests_at(600.0) == 6000
    longer = curve_settings(Profiling.model_validate({"curveMinSecondsPerRate": 30}))
    assert longer.requests_at(600.0) == 18000
    assert longer.requests_at(1.0) == 120  # 300 requests would take 300 s: capped at 120 s
    capped = curve_settings(
        Profiling.model_validate({"curveMinSecondsPerRate": 60, "curveMaxSecondsPerRate": 20})
    )
    assert capped.requests_at(600.0) == 12000


def _knee(rate: float) -> CurvePoint:
    """A pod of capacity 10/s whose p95 (100 ms idle) grows as 1 / (1 - load)."""
    return point(rate, 100 / max(1 - rate / 10, 0.01), min(rate, 10))


def test_ladder_halves_below_its_first_rate_only_while_that_rate_is_over_the_slo() -> None:
    """The first rate (2.5/s) reads 133 ms: for a 150 ms SLO no rate goes below it, for 120 ms
    one (1.25/s reads 114 ms), without an SLO two (down to within LADDER_FINEST of idle); the
    curve records the budget its low end was measured for."""
    plain = climb_ladder(100, 1, _knee, idle_p95_ms=100)
    loose = climb_ladder(100, 1, _knee, idle_p95_ms=100, slo_ms=150)
    tight = climb_ladder(100, 1, _knee, idle_p95_ms=100, slo_ms=120)
    assert plain.points[0].offered_qps == pytest.approx(0.625)
    assert loose.points[0].offered_qps == pytest.approx(2.5)
    assert tight.points[0].offered_qps == pytest.approx(1.25)
    assert (plain.slo_ms, loose.slo_ms, tight.slo_ms) == (None, 150, 120)
    # The SLO at another percentile: the p99 (1.3 x p95) of 1.25/s, 148 ms, is over 120 ms.
    p99 = climb_ladder(100, 1, _knee, idle_p95_ms=100, slo_ms=120, percentile=99.0)
    assert p99.points[0].offered_qps == pytest.approx(0.625)
    # A budget at or above the one measured for needs nothing more; a tighter one does,
    # unless the ladder would not have halved for it anyway.
    assert loose.low_end_resolved(150, 95.0, 100, 100)
    assert loose.low_end_resolved(400, 95.0, 100, 100)
    assert not loose.low_end_resolved(120, 95.0, 100, 100)
    assert tight.low_end_resolved(115, 95.0, 100, 100)
    assert not tight.low_end_resolved(110, 95.0, 100, 100)
    assert plain.low_end_resolved(50, 95.0, 100, 100)


def test_an_slo_aware_ladder_on_a_simulated_pod_spends_no_rate_under_the_slo() -> None:
    """On rag-sim's pod at c = 4, the SLO-aware ladder halves below its first rate only from a
    rate over the SLO (fewer rates than the ladder that halves regardless), stops at the first
    within it, and reads the same rate at the SLO."""
    slow = normal_profile("slow", 0.9, 400, 60)
    pod = PodModel(4, RAG_SIM_STAGES)
    idle = slow.latency_at(95.0)
    slo = 1.2 * idle
    first = LADDER_START * 1000 / slow.mean_ms
    plain = measure_capacity(slow, pod, requests=600)
    aware = measure_capacity(slow, pod, requests=600, slo_ms=slo)

    def halvings(curve: CapacityCurve) -> int:
        # Realised rates stray from the offered ones by a few percent; a halving by half.
        return sum(1 for p in curve.points if p.offered_qps < 0.75 * first)

    spent = halvings(aware)
    assert 1 <= spent < halvings(plain)
    for halved_from in aware.points[1 : spent + 1]:
        assert halved_from.latency_at(95.0) > slo
    assert aware.points[0].latency_at(95.0) <= slo
    assert aware.slo_ms == slo
    assert aware.max_rate(slo, 95.0, idle) == pytest.approx(
        plain.max_rate(slo, 95.0, idle), rel=0.15
    )


def test_a_curves_budget_survives_the_profiles_file_and_the_policy_spec() -> None:
    """``slo_ms`` is written, read back, scaled with the times and carried by the ParetoPolicy;
    a curve without it reads as before (measured for any budget); a bad one is named."""
    curve = climb_ladder(100, 1, _knee, idle_p95_ms=100, slo_ms=150)
    document = curve.to_json()
    assert document["slo_ms"] == 150
    assert parse_curve(document, "capacity") == curve
    assert "slo_ms" not in climb_ladder(100, 1, _knee, idle_p95_ms=100).to_json()
    older = {key: value for key, value in document.items() if key != "slo_ms"}
    assert parse_curve(older, "capacity").slo_ms is None
    assert scaled_curve(curve, 0.5).slo_ms == 75
    profile = replace(FAST, capacity=curve)
    assert latency_profile(front_entry(profile)).capacity == curve
    with pytest.raises(CapacityError) as error:
        parse_curve({**document, "slo_ms": "fast"}, "capacity")
    assert error.value.field == "capacity.slo_ms"
    with pytest.raises(ValidationError, match=r"slo_ms|sloMs"):
        CapacitySpec.model_validate({**document, "slo_ms": -1})
