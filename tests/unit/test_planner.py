"""The planner: profile validation, the fitted service distributions, the front, the thresholds."""

from __future__ import annotations

import itertools
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass.domain.planner import (
    MAX_QUEUE_LIMIT,
    PlanError,
    Slo,
    ThresholdModel,
    _max_rate,
    _queue_limit,
    _Service,
    _service_grid,
    _sum_tail,
    _violation,
    _violation_mgc,
    pareto_front,
    plan_thresholds,
)
from compass.domain.profiles import LatencyProfile, ProfileError, fit_distribution, parse_profiles

PAPER = Path(__file__).resolve().parents[2] / "bench" / "data" / "compass-paper"
PROFILES = PAPER / "planner_latency_profiles.json"


def profile(
    name: str,
    accuracy: float,
    mean: float,
    p95: float,
    *,
    p50: float | None = None,
    p99: float | None = None,
    std: float | None = None,
) -> LatencyProfile:
    return LatencyProfile({"c": name}, accuracy, mean, p95, p50, p99, std)


def entry(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "config": {"model": "m", "k": 1},
        "accuracy": 0.8,
        "latency_mean_ms": 100.0,
        "latency_p50_ms": 98.0,
        "latency_p95_ms": 130.0,
        "latency_p99_ms": 150.0,
        "latency_std_ms": 15.0,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


@pytest.fixture(scope="module")
def paper_profiles() -> tuple[LatencyProfile, ...]:
    return parse_profiles(json.loads(PROFILES.read_text(encoding="utf-8")))


# ---------------------------------------------------------------------------- profiles


def test_parse_reads_every_measured_statistic() -> None:
    """A profiler entry becomes a profile with its config and all five statistics."""
    (parsed,) = parse_profiles({"profiles": [entry()]})
    assert dict(parsed.config) == {"model": "m", "k": 1}
    assert (parsed.mean_ms, parsed.p50_ms, parsed.p95_ms, parsed.p99_ms, parsed.std_ms) == (
        100.0,
        98.0,
        130.0,
        150.0,
        15.0,
    )
    assert parsed.name == "m/1"


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (entry(latency_p95_ms=None), "profiles[0].latency_p95_ms: missing"),
        (entry(latency_mean_ms=-3.0), "profiles[0].latency_mean_ms: -3 is negative"),
        (entry(latency_p99_ms=-1.0), "profiles[0].latency_p99_ms: -1 is negative"),
        (entry(latency_p95_ms="fast"), "profiles[0].latency_p95_ms: 'fast' is not a number"),
        (entry(latency_p99_ms=120.0), "profiles[0].latency_p99_ms: 120 is below"),
        (entry(accuracy=1.5), "profiles[0].accuracy: 1.5 is above 1"),
        (entry(latency_mean_ms=200.0), "profiles[0].latency_mean_ms: 200 is above"),
        (entry(config={}), "profiles[0].config: missing or empty"),
    ],
)
def test_parse_rejects_a_bad_profile_naming_the_field(bad: dict[str, Any], field: str) -> None:
    """Each defect is one line that starts with the offending field."""
    with pytest.raises(ProfileError) as caught:
        parse_profiles([bad])
    message = str(caught.value)
    assert message.startswith(field), message
    assert "\n" not in message
    assert "; " in message  # and a fix


def test_parse_rejects_duplicates_and_emptiness() -> None:
    """The same configuration twice, or no profile at all, is an error."""
    with pytest.raises(ProfileError, match=r"profiles\[1\]\.config: the same configuration"):
        parse_profiles([entry(), entry(accuracy=0.9)])
    with pytest.raises(ProfileError, match="front is empty"):
        parse_profiles({"profiles": []})


@given(
    mean=st.floats(50, 500),
    spread=st.floats(0.02, 0.3),
    skew=st.floats(0.8, 1.6),
    with_std=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_fitted_distribution_passes_through_the_percentiles_and_keeps_the_mean(
    mean: float, spread: float, skew: float, with_std: bool
) -> None:
    """Quantiles at 50/95/99 are the measured ones; the mean is matched; std too when possible."""
    sd = mean * spread
    p50 = mean - 0.1 * sd
    p95 = p50 + 1.645 * sd * skew
    p99 = p95 + 0.7 * sd * skew
    std = sd if with_std else None
    fitted = fit_distribution(mean, {50.0: p50, 95.0: p95, 99.0: p99}, std)
    assert fitted.quantile(np.array([0.5, 0.95, 0.99])) == pytest.approx([p50, p95, p99], rel=1e-9)
    assert fitted.mean_ms == pytest.approx(mean, rel=1e-6)
    if std is not None and fitted.low_slope > 0 and fitted.high_slope > 0:
        assert fitted.std_ms == pytest.approx(std, rel=1e-4)
    # The quantile function never decreases and never goes below zero.
    levels = np.linspace(0.0005, 0.9995, 2001)
    values = fitted.quantile(levels)
    assert np.all(np.diff(values) >= -1e-9)
    assert values.min() >= 0


def test_fitted_distribution_of_a_normal_profile_is_that_normal() -> None:
    """Mean 200, std 20: the fit's quantiles are the normal's everywhere."""
    z = {50.0: 0.0, 95.0: 1.6448536269514722, 99.0: 2.3263478740408408}
    fitted = fit_distribution(200, {p: 200 + 20 * q for p, q in z.items()}, 20)
    assert fitted.quantile(np.array([0.01, 0.2, 0.8])) == pytest.approx(
        [
            200 - 20 * 2.3263478740408408,
            200 - 20 * 0.8416212335729143,
            200 + 20 * 0.8416212335729143,
        ],
        rel=1e-6,
    )


def test_sampled_service_times_match_the_paper_profiles(
    paper_profiles: tuple[LatencyProfile, ...],
) -> None:
    """Drawing 100k times from each fitted distribution reproduces its mean and percentiles."""
    rng = np.random.default_rng(7)
    u = rng.uniform(size=100_000)
    for p in paper_profiles:
        draws = p.distribution.quantile(u)
        assert draws.mean() == pytest.approx(p.mean_ms, rel=0.003)
        measured = [p.p50_ms, p.p95_ms, p.p99_ms]
        assert np.percentile(draws, [50, 95, 99]) == pytest.approx(measured, rel=0.01)
        assert p.std_ms is not None
        # The percentiles alone can force a wider spread than measured, never a narrower one;
        # where the std needs a long tail above p99, 100k draws see a little less of it.
        assert p.std_ms * 0.97 <= draws.std() <= p.std_ms * 1.25


# ---------------------------------------------------------------------------- front


def dominates(a: LatencyProfile, b: LatencyProfile) -> bool:
    return (
        a.accuracy >= b.accuracy
        and a.p95_ms <= b.p95_ms
        and (a.accuracy, a.p95_ms)
        != (
            b.accuracy,
            b.p95_ms,
        )
    )


def test_front_of_the_paper_profiles(paper_profiles: tuple[LatencyProfile, ...]) -> None:
    """Nothing on the front is dominated, everything off it is, and it is ordered by speed."""
    front = pareto_front(paper_profiles)
    members = front.members
    for member in members:
        assert not any(dominates(other, member) for other in paper_profiles)
    off = [p for p in paper_profiles if all(p is not m for m in members)]
    for p in off:
        assert any(dominates(m, p) for m in members)
    means = [m.mean_ms for m in members]
    assert means == sorted(means)
    assert [m.accuracy for m in members] == sorted(m.accuracy for m in members)
    # The paper lists three of these four; the fourth is faster and 6.5 points less accurate.
    assert len(members) == 4


def test_front_breaks_ties_and_drops_duplicates() -> None:
    """Equal accuracy and tail keeps the lower mean; equal accuracy keeps the lower tail."""
    fast = profile("fast", 0.70, 100, 120)
    twin = profile("twin", 0.70, 105, 120)  # same point, slower mean: dropped
    worse_tail = profile("worse", 0.70, 90, 125)  # same accuracy, worse tail: dominated
    accurate = profile("accurate", 0.90, 200, 240)
    slower_same_tail = profile("same-tail", 0.80, 210, 240)  # accurate is as fast, and better
    front = pareto_front([twin, accurate, worse_tail, fast, slower_same_tail])
    assert [m.config["c"] for m in front.members] == ["fast", "accurate"]


def test_a_member_faster_on_the_mean_stays_beside_a_more_accurate_one_with_its_tail() -> None:
    """Two near-equal configurations profiled live: the less accurate one's p95 came out 0.1 ms
    worse, but its mean is 5% lower, which is capacity a spike needs (measured on rag-sim)."""
    quick = profile("quick", 0.7718, 154.2, 181.2)
    better = profile("better", 0.8318, 161.9, 181.1)
    front = pareto_front([better, quick])
    assert [m.config["c"] for m in front.members] == ["quick", "better"]
    # As fast on the mean too: then it is beaten.
    front = pareto_front([better, profile("quick", 0.7718, 162.0, 181.2)])
    assert [m.config["c"] for m in front.members] == ["better"]


def test_front_drops_a_member_slower_on_the_mean_and_no_more_accurate() -> None:
    """Better tail but worse mean and accuracy than a faster member: not worth switching to."""
    a = profile("a", 0.80, 100, 200)
    b = profile("b", 0.75, 120, 150)  # on the (accuracy, p95) front, but slower on the mean
    front = pareto_front([a, b])
    assert [m.config["c"] for m in front.members] == ["a"]


@given(
    points=st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 30), st.integers(0, 5)),
        min_size=1,
        max_size=25,
    )
)
@settings(max_examples=150, deadline=None)
def test_front_matches_brute_force(points: list[tuple[int, int, int]]) -> None:
    """Against a brute-force Pareto set (a more accurate member beats another only when it is as
    fast at p95 and on the mean; an equally accurate one when it is faster at p95), ties
    collapsed, means ordered."""
    profiles = [
        profile(str(i), acc / 20, mean=10.0 * tail - extra, p95=10.0 * tail)
        for i, (acc, tail, extra) in enumerate(points)
    ]

    def beats(a: LatencyProfile, b: LatencyProfile) -> bool:
        if a.accuracy == b.accuracy:
            return a.p95_ms < b.p95_ms
        return a.accuracy > b.accuracy and a.p95_ms <= b.p95_ms and a.mean_ms <= b.mean_ms

    front = pareto_front(profiles).members
    pareto = [p for p in profiles if not any(beats(q, p) for q in profiles)]
    distinct_points = {(p.accuracy, p.p95_ms) for p in pareto}
    assert {(m.accuracy, m.p95_ms) for m in front} <= distinct_points
    assert len({(m.accuracy, m.p95_ms) for m in front}) == len(front)
    # Only the mean filter may drop a Pareto point, and only for a faster, as accurate member.
    for point in distinct_points - {(m.accuracy, m.p95_ms) for m in front}:
        dropped = [p for p in pareto if (p.accuracy, p.p95_ms) == point]
        assert all(
            any(m.mean_ms <= d.mean_ms and m.accuracy >= d.accuracy for m in front) for d in dropped
        )
    for before, after in itertools.pairwise(front):
        assert before.mean_ms <= after.mean_ms
        assert before.accuracy < after.accuracy


def test_empty_profiles_make_no_front() -> None:
    """No profile: a PlanError that says the front is empty."""
    with pytest.raises(PlanError, match="front is empty"):
        pareto_front([])


# ---------------------------------------------------------------------------- thresholds


def test_paper_mean_thresholds_follow_equations_9_and_12() -> None:
    """Stay while N * mean <= L - p95; enter while N * mean <= L - p95 - h_s."""
    fast = profile("fast", 0.7, 100, 200)
    slow = profile("slow", 0.9, 160, 260)
    plan = plan_thresholds([fast, slow], Slo(500), 50, ThresholdModel.PAPER_MEAN)
    first, second = plan.thresholds
    assert first.slack_ms == pytest.approx(300)
    assert first.stay_max_queue == 3  # 3 * 100 = 300 <= 300 < 400
    assert first.enter_max_queue == 2  # 2 * 100 = 200 <= 250 < 300
    assert second.stay_max_queue == 1  # 160 <= 240 < 320
    assert second.enter_max_queue == 1  # 160 <= 190
    assert first.can_stay(3)
    assert not first.can_stay(4)
    assert second.can_enter(1)
    assert not second.can_enter(2)
    # The paper model has no arrival-rate limits.
    assert first.stay_max_qps is None
    assert first.can_stay(0, arrival_qps=1e9)


@given(
    mean=st.floats(20, 400),
    excess=st.floats(0, 200),
    budget=st.floats(1, 5000),
    percentile=st.sampled_from([90.0, 95.0, 99.0]),
)
@settings(max_examples=200, deadline=None)
def test_tail_queue_limit_is_the_largest_depth_meeting_the_budget(
    mean: float, excess: float, budget: float, percentile: float
) -> None:
    """stay_max_queue is exactly where the percentile of the N + 1 service times crosses L."""
    p = profile("x", 0.8, mean, mean + excess, p99=mean + 1.5 * excess)
    tail = p.latency_at(percentile)
    depth = _queue_limit(p.mean_ms, tail, budget, ThresholdModel.TAIL)
    if tail > budget + 1e-9:
        assert depth is None
        return
    assert depth is not None
    assert _sum_tail(p.mean_ms, tail, depth + 1) <= budget + 1e-6
    assert _sum_tail(p.mean_ms, tail, depth + 2) > budget - 1e-6
    # Never more permissive than the paper's model, which ignores the spread of the wait.
    paper = _queue_limit(p.mean_ms, tail, budget, ThresholdModel.PAPER_MEAN)
    assert paper is not None
    assert depth <= paper


def test_configurations_without_slack_stay_in_the_plan_but_are_never_targets() -> None:
    """p95 above the SLO: reported with its negative slack, never eligible, never enterable."""
    fast = profile("fast", 0.7, 100, 200)
    slow = profile("slow", 0.9, 400, 600)
    plan = plan_thresholds([fast, slow], Slo(500), 50, ThresholdModel.TAIL)
    assert plan.names == ("fast", "slow")
    blocked = plan.thresholds[1]
    assert blocked.slack_ms == pytest.approx(-100)
    assert not blocked.eligible
    assert not blocked.can_enter(0, 0.0)
    assert plan.eligible == (0,)


def test_slo_below_every_p95_names_the_closest_configuration() -> None:
    """The error names the closest configuration and by how much it misses."""
    a = profile("near", 0.7, 100, 180)
    b = profile("far", 0.9, 300, 400)
    with pytest.raises(PlanError) as caught:
        plan_thresholds([a, b], Slo(150), 50)
    message = str(caught.value)
    assert message.startswith("slo.latencyMs: 150 ms is below every configuration's p95")
    assert "near" in message
    assert "30.0 ms over" in message


@pytest.mark.parametrize(("latency", "percentile"), [(0.0, 95.0), (100.0, 100.0), (100.0, 0.0)])
def test_slo_must_be_positive_with_a_percentile_inside_0_100(
    latency: float, percentile: float
) -> None:
    """A non-positive target or a percentile outside (0, 100) is refused."""
    with pytest.raises(PlanError, match=r"^slo\."):
        Slo(latency, percentile)


def violation_probability(p: LatencyProfile, arrival_qps: float, budget_ms: float) -> float:
    """P(latency > budget) at this Poisson rate, as the planner's M/G/1 tail predicts it."""
    return _violation(_service_grid(p), arrival_qps, budget_ms / 1000)


def max_arrival_rate(p: LatencyProfile, budget_ms: float, percentile: float) -> float:
    """The planner's M/G/1 rate limit for this budget."""
    return _max_rate(_service_grid(p), budget_ms, percentile=percentile)


def test_rate_limit_is_where_the_mg1_violation_reaches_the_budget(
    paper_profiles: tuple[LatencyProfile, ...],
) -> None:
    """At the limit the predicted violation is 1 - P/100; below it less, above it more."""
    p = pareto_front(paper_profiles).members[2]
    for slo, percentile in ((500.0, 95.0), (1000.0, 95.0), (1000.0, 99.0)):
        limit = max_arrival_rate(p, slo, percentile)
        assert 0 < limit < 1000 / p.mean_ms
        allowed = 1 - percentile / 100
        assert violation_probability(p, limit, slo) == pytest.approx(allowed, abs=1e-6)
        assert violation_probability(p, 0.9 * limit, slo) < allowed
        assert violation_probability(p, 1.1 * limit, slo) > allowed
    # A stricter SLO or percentile allows less load.
    assert max_arrival_rate(p, 500, 95) < max_arrival_rate(p, 1000, 95)
    assert max_arrival_rate(p, 1000, 99) < max_arrival_rate(p, 1000, 95)


def test_violation_probability_limits() -> None:
    """No load: only the service time can miss; saturation: every request misses."""
    p = profile("x", 0.8, 100, 130, p50=98, p99=150, std=15)
    assert violation_probability(p, 0.0, 130) == pytest.approx(0.05, abs=0.003)
    assert violation_probability(p, 10.0, 10_000) == 1.0  # rho = 1
    low, high = (violation_probability(p, rate, 400) for rate in (2.0, 6.0))
    assert 0 < low < high < 1


def test_plan_index_and_names_follow_the_front_order() -> None:
    """Plan lookups by name return the front position; unknown names give None."""
    fast = profile("fast", 0.7, 100, 200)
    slow = profile("slow", 0.9, 160, 260)
    plan = plan_thresholds([fast, slow], Slo(1000))
    assert plan.index(slow.name) == 1
    assert plan.index("nope") is None
    assert math.isfinite(plan.thresholds[0].stay_max_qps or math.nan)


def test_the_switch_delay_is_left_out_of_the_queue_budgets_only() -> None:
    """A 100 ms switch delay lowers the queue limits as a 100 ms lower SLO would; the rate
    limits (steady state) stay."""
    front = [profile("fast", 0.7, 100, 130), profile("slow", 0.9, 200, 260)]
    prompt = plan_thresholds(front, Slo(1000), 50)
    delayed = plan_thresholds(front, Slo(1000), 50, switch_delay_ms=100)
    lower = plan_thresholds(front, Slo(900), 50)
    assert delayed.switch_delay_ms == 100
    for quick, late, short in zip(
        prompt.thresholds, delayed.thresholds, lower.thresholds, strict=True
    ):
        assert (late.stay_max_queue, late.enter_max_queue) == (
            short.stay_max_queue,
            short.enter_max_queue,
        )
        assert late.stay_max_qps == quick.stay_max_qps
        assert late.slack_ms == quick.slack_ms
    assert delayed.thresholds[0].stay_max_queue < prompt.thresholds[0].stay_max_queue
    with pytest.raises(PlanError, match="switchDelayMs"):
        plan_thresholds(front, Slo(1000), 50, switch_delay_ms=-1)


def _within_seconds(seconds: int, work: Any) -> Any:
    """Run work, failing if it does not return within the time (an unbounded loop)."""
    import signal

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        return work()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("model", list(ThresholdModel))
def test_queue_limit_ends_and_is_capped_on_a_vanishing_mean(model: ThresholdModel) -> None:
    """A mean of 1e-300 ms (float precision gone in the closed form) once looped for hours."""
    depth = _within_seconds(5, lambda: _queue_limit(1e-300, 1.0, 3_600_000.0, model, 4))
    assert depth == MAX_QUEUE_LIMIT


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (entry(latency_mean_ms=1e-300), "profiles[0].latency_mean_ms: 1e-300 ms is below"),
        (entry(latency_p50_ms=1e-9), "profiles[0].latency_p50_ms: 1e-09 ms is below"),
        (entry(latency_p99_ms=1e12), "profiles[0].latency_p99_ms: 1e+12 ms is above"),
        (entry(latency_std_ms=1e12), "profiles[0].latency_std_ms: 1e+12 ms is above"),
    ],
)
def test_parse_rejects_latencies_outside_a_sane_range(bad: dict[str, Any], field: str) -> None:
    """Service times are kept between a microsecond and an hour, where the planner's arithmetic
    holds: a profile of 1e-300 ms once hung `compass plan`."""
    with pytest.raises(ProfileError, match=re.escape(field)):
        parse_profiles([bad])


def test_a_service_far_past_the_budget_adds_no_overflow_on_many_servers() -> None:
    """Erlang C's tail with a steep decay: the times past the budget count in full, and the
    exponential of their (discarded) negative slack no longer overflows into a warning."""
    service = _Service(np.array([0.0001, 0.2]), np.array([0.999, 0.001]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        violation = _violation_mgc(service, 1.0, 0.01, 1000)
    assert violation == pytest.approx(0.001)
