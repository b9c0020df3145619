"""The predictive strategy: a forecast of the next seconds picks the most accurate safe mix."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import numpy as np
import pytest

from compass.domain.admission import Admission, AdmissionPoint
from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.capacity import CapacityCurve, CurvePoint
from compass.domain.elastico import Elastico, ElasticoSettings, MetricsLoss
from compass.domain.mix import Mix, mix_weighting
from compass.domain.planner import Plan, Slo, ThresholdModel, plan_thresholds
from compass.domain.policy import Action, Decision, Observation, PolicyState
from compass.domain.predictive import (
    MIN_EVIDENCE_S,
    Predictive,
    arrivals_dispersion,
    clump_size,
    fifo_starts,
)
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import StaticController, simulate
from compass.domain.strategy import Strategy, build_policy
from compass_dev.scenarios import normal_profile as profile

FRONT = [
    profile("fast", 0.70, 100, 15),
    profile("mid", 0.80, 150, 20),
    profile("slow", 0.90, 250, 30),
]
PLAN = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)
MOST_ACCURATE = Mix(2)


def steady_run(
    policy: Predictive, qps: float, seconds: int, queue: float = 0.0
) -> tuple[Mix, PolicyState, list[Action]]:
    """Observations once a second of arrivals at ``qps`` and a fixed queue; the last routing."""
    state = policy.initial_state(0.0)
    actions = []
    decision = None
    for t in range(1, seconds + 1):
        observation = Observation(float(t), queue, arrivals_total=qps * t)
        decision, state = policy.decide(observation, state, float(t))
        actions.append(decision.action)
    assert decision is not None
    return decision.mix, state, actions


def test_a_light_steady_load_is_served_by_the_most_accurate_member() -> None:
    mix, state, actions = steady_run(Predictive(PLAN), qps=0.5, seconds=10)
    assert mix == MOST_ACCURATE
    assert state.active == "slow"
    assert state.blend is None
    # It climbs once the rate is known, and then stays.
    assert actions[-1] is Action.HOLD
    assert Action.MORE_ACCURATE in actions


def test_before_the_rate_is_known_it_serves_the_fastest() -> None:
    policy = Predictive(PLAN)
    decision, _ = policy.decide(Observation(0.5, 0, arrivals_total=1), policy.initial_state(0), 0.5)
    assert decision.mix == Mix(0)
    assert "no arrival rate" in decision.reason
    assert MIN_EVIDENCE_S > 0.5


def test_a_heavy_load_keeps_the_fastest_and_a_moderate_one_a_mix_between() -> None:
    # The fastest holds 10/s at 100 ms; the most accurate only 4/s.
    heavy, _, _ = steady_run(Predictive(PLAN), qps=6.0, seconds=20)
    moderate, _, _ = steady_run(Predictive(PLAN), qps=2.0, seconds=20)
    assert heavy.position < moderate.position < MOST_ACCURATE.position


def test_a_queue_drives_it_to_a_faster_mix_at_once() -> None:
    policy = Predictive(PLAN)
    _, state, _ = steady_run(policy, qps=0.5, seconds=10)
    assert state.active == "slow"
    decision, after = policy.decide(Observation(11.0, 12, arrivals_total=5.5), state, 11.0)
    assert decision.action is Action.FASTER
    assert decision.mix.position < MOST_ACCURATE.position
    assert after.switches == state.switches + 1


def test_more_risk_buys_more_accuracy() -> None:
    careful, _, _ = steady_run(Predictive(PLAN, risk=0.0), qps=3.0, seconds=20)
    bold, _, _ = steady_run(Predictive(PLAN, risk=0.2), qps=3.0, seconds=20)
    assert careful.position < bold.position


def test_the_forecast_is_deterministic_and_grows_with_the_queue_and_the_mix() -> None:
    policy = Predictive(PLAN)
    again = Predictive(PLAN)
    share = policy.miss_share(Mix(1, 2, 0.5), 3.0, 2, Mix(1))
    assert share == again.miss_share(Mix(1, 2, 0.5), 3.0, 2, Mix(1))
    assert policy.miss_share(Mix(1, 2, 0.5), 3.0, 8, Mix(1)) > share
    assert (
        policy.miss_share(Mix(2), 3.0, 2, Mix(1))
        >= share
        >= policy.miss_share(Mix(0), 3.0, 2, Mix(1))
    )
    assert policy.miss_share(Mix(2), 0.0, 0, Mix(2)) == 0.0
    # A surge of the rate for the first seconds makes the same mix miss more.
    assert policy.miss_share(Mix(1, 2, 0.5), 3.0, 2, Mix(1), surge=True) > share


def test_a_mix_must_survive_a_surge_the_plain_forecast_would_allow() -> None:
    """At a load the most accurate member holds on average, a surge would overwhelm it: the
    policy stops short of it, where the plain forecast alone would not."""
    policy = Predictive(PLAN)
    rate = 1.5
    top = policy.miss_share(MOST_ACCURATE, rate, 0, Mix(0))
    top_surged = policy.miss_share(MOST_ACCURATE, rate, 0, Mix(0), surge=True)
    fastest = policy.miss_share(Mix(0), rate, 0, Mix(0))
    fastest_surged = policy.miss_share(Mix(0), rate, 0, Mix(0), surge=True)
    assert top <= fastest + policy.risk
    assert top_surged > fastest_surged + policy.risk
    mix, _, _ = steady_run(policy, qps=rate, seconds=20)
    assert mix.position < MOST_ACCURATE.position


def test_a_stale_reading_holds_then_falls_back_unless_told_to_hold() -> None:
    policy = Predictive(PLAN)
    _, state, _ = steady_run(policy, qps=0.5, seconds=10)
    old = Observation(10.0, 0, arrivals_total=5.0)
    held, state_held = policy.decide(old, state, 13.0)
    assert held.action is Action.HOLD
    assert held.mix == MOST_ACCURATE
    fallback, _ = policy.decide(old, state_held, 20.0)
    assert fallback.action is Action.FALLBACK
    assert fallback.mix == Mix(0)
    holding = Predictive(PLAN, ElasticoSettings(on_metrics_loss=MetricsLoss.HOLD))
    kept, _ = holding.decide(None, state, 20.0)
    assert kept.action is Action.HOLD
    assert kept.mix == MOST_ACCURATE


def test_paused_it_holds_whatever_the_load() -> None:
    paused = Predictive(PLAN, ElasticoSettings(paused=True))
    state = PolicyState(active="slow", active_since=0.0)
    decision, after = paused.decide(Observation(5.0, 50, arrivals_total=100), state, 5.0)
    assert decision.action is Action.HOLD
    assert decision.mix == MOST_ACCURATE
    assert after == state


def test_a_routing_off_its_hull_falls_back_to_the_fastest() -> None:
    policy = Predictive(PLAN)
    state = PolicyState(active="gone", active_since=0.0)
    decision, after = policy.decide(Observation(1.0, 0, arrivals_total=1), state, 1.0)
    assert decision.action is Action.FALLBACK
    assert decision.mix == Mix(0)
    assert after.active == "fast"


def test_its_state_survives_a_round_trip_through_json() -> None:
    policy = Predictive(PLAN)
    _, state, _ = steady_run(policy, qps=4.5, seconds=20)
    restored = PolicyState.from_dict(json.loads(json.dumps(state.to_dict())))
    observation = Observation(21.0, 1, arrivals_total=4.5 * 21)
    assert policy.decide(observation, restored, 21.0) == policy.decide(observation, state, 21.0)


@pytest.mark.parametrize(("field", "value"), [("risk", 1.0), ("risk", -0.1)])
def test_bad_settings_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Predictive(PLAN, **{field: value})


def test_the_spec_enum_builds_it() -> None:
    assert isinstance(build_policy(Strategy.PREDICTIVE, PLAN), Predictive)


def test_with_admission_it_keeps_the_slo_as_the_fastest_does_and_wins_more_than_elastico() -> None:
    """A spike in the simulator (seeds averaged): with admission at dispatch it meets the SLO at
    least as often as static fastest, and wins more accuracy than Elastico with admission."""
    plan = plan_thresholds(FRONT, Slo(600), 50, ThresholdModel.TAIL)
    admission = Admission(600, at=AdmissionPoint.DISPATCH)
    policies = {
        "fastest": (StaticController("fast", 0), None),
        "elastico": (Elastico(plan), admission),
        "predictive": (Predictive(plan), admission),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in policies}
    for seed in range(3):
        scenario = make_scenario(make_pattern("spike", 1.0, 120, seed=seed), seed)
        for name, (controller, rule) in policies.items():
            run = simulate(controller, FRONT, scenario, 600, admission=rule)
            runs[name].append((run.compliance, run.mean_accuracy))
    means = {name: np.mean(figures, axis=0) for name, figures in runs.items()}
    assert means["predictive"][0] >= means["fastest"][0]
    gap = 0.90 - 0.70
    assert means["predictive"][1] - means["elastico"][1] > 0.1 * gap


def test_one_instance_starts_match_the_request_by_request_recursion() -> None:
    """The closed form for one instance equals the general loop (here with a second instance
    that never frees, so the loop uses the first alone), queued requests included."""
    rng = np.random.default_rng(7)
    paths, queued, arriving = 5, 3, 40
    arrivals = np.cumsum(rng.exponential(0.1, (paths, arriving)), axis=1)
    holding = rng.gamma(2.0, 0.06, (paths, arriving))
    ahead = rng.gamma(2.0, 0.06, (paths, queued))
    start = rng.uniform(0, 0.2, (paths, 1))
    closed = fifo_starts(start, ahead, arrivals, holding)
    looped = fifo_starts(np.hstack([start, np.full((paths, 1), np.inf)]), ahead, arrivals, holding)
    np.testing.assert_allclose(closed, looped)
    assert (closed >= arrivals - 1e-12).all()
    # Two instances start requests no later than one, and some sooner.
    two = fifo_starts(np.hstack([start, start]), ahead, arrivals, holding)
    assert (two <= closed + 1e-9).all()
    assert (two < closed - 1e-3).any()


def test_a_pod_that_drains_slower_than_its_profiles_is_forecast_so() -> None:
    """A member whose capacity curve says a busy pod holds each request twice its profile's
    time: the forecast misses more at the same load, so the policy serves a faster mix."""

    def halved(member: LatencyProfile) -> LatencyProfile:
        drain = 1000 / (2 * member.mean_ms)
        points = (
            CurvePoint(drain / 2, drain / 2, member.mean_ms, ((50.0, member.mean_ms),)),
            CurvePoint(2 * drain, drain, 5000.0, ((50.0, 5000.0),), growing=True),
        )
        return dataclasses.replace(member, capacity=CapacityCurve(1, points))

    slow_pod = [halved(m) for m in FRONT]
    plan = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)
    stretched = replace(
        plan,
        thresholds=tuple(
            dataclasses.replace(t, profile=p)
            for t, p in zip(plan.thresholds, slow_pod, strict=True)
        ),
    )
    assert Predictive(stretched).miss_share(Mix(0), 4.0, 2, Mix(0)) > Predictive(plan).miss_share(
        Mix(0), 4.0, 2, Mix(0)
    )
    plain, _, _ = steady_run(Predictive(plan), qps=3.0, seconds=20)
    slowed, _, _ = steady_run(Predictive(stretched), qps=3.0, seconds=20)
    assert slowed.position < plain.position


def test_the_forecast_deals_a_mix_as_its_router_does() -> None:
    policy = Predictive(PLAN)
    mix = Mix(1, 2, 0.35)
    weighting = mix_weighting(mix)
    expected = [weighting.pick() for _ in range(100)]
    assert policy.paths.dealt(mix)[:100].tolist() == expected


def clumped_run(policy: Predictive, clump: int, every: int, seconds: int) -> list[Decision]:
    """Observations once a second of ``clump`` arrivals at once every ``every`` s (and none
    between), the queue empty at each look; every decision."""
    state = policy.initial_state(0.0)
    decisions = []
    for t in range(1, seconds + 1):
        total = clump * (t // every)
        decision, state = policy.decide(Observation(float(t), 0, arrivals_total=total), state, t)
        decisions.append(decision)
    return decisions


def counter(counts: list[int], start: float = 0.0) -> list[tuple[float, float]]:
    """(time, counter) samples once a second for these per-second counts."""
    return [(start + t, float(sum(counts[:t]))) for t in range(len(counts) + 1)]


def test_poisson_counts_read_as_no_dispersion_and_clumps_as_their_size() -> None:
    rng = np.random.default_rng(3)
    poisson = counter(rng.poisson(2.0, 60).tolist())
    assert arrivals_dispersion(poisson, 60.0) == 1.0
    # 10 at once every 4 s: per-second counts 10, 0, 0, 0 (variance / mean about 10).
    clumped = counter([10 if t % 4 == 0 else 0 for t in range(60)])
    assert 6 < arrivals_dispersion(clumped, 60.0) < 14
    # Too few intervals to tell: Poisson.
    assert arrivals_dispersion(clumped[:8], 7.0) == 1.0
    assert arrivals_dispersion([], 0.0) == 1.0
    # The counter is per pod: two pods' clumps are twice the size the counter shows.
    halved = [(t, total / 2) for t, total in clumped]
    assert arrivals_dispersion(halved, 60.0, pods=2) == pytest.approx(
        arrivals_dispersion(clumped, 60.0)
    )


def test_a_slow_change_of_the_rate_is_not_taken_for_clumps() -> None:
    """A rate that climbs steadily from 1 to 10 per second: the counts' plain variance over
    their mean is far above 1, their successive differences' is not."""
    rng = np.random.default_rng(5)
    counts = rng.poisson(np.linspace(1, 10, 60)).tolist()
    plain = np.var(counts) / np.mean(counts)
    assert plain > 2
    assert arrivals_dispersion(counter(counts), 60.0) == 1.0


def test_clumps_of_one_are_the_poisson_forecast_and_bigger_ones_miss_more() -> None:
    policy = Predictive(PLAN)
    for surge in (False, True):
        plain = policy.miss_share(Mix(1, 2, 0.5), 3.0, 2, Mix(1), surge)
        assert policy.miss_share(Mix(1, 2, 0.5), 3.0, 2, Mix(1), surge, clump=1.0) == plain
        clumped = policy.miss_share(Mix(1, 2, 0.5), 3.0, 2, Mix(1), surge, clump=4.0)
        assert clumped > plain
    # Clumps cost a slower mix more than the fastest: the gap between them grows.
    gap = {
        clump: policy.miss_share(Mix(2), 2.0, 0, Mix(0), clump=clump)
        - policy.miss_share(Mix(0), 2.0, 0, Mix(0), clump=clump)
        for clump in (1.0, 5.0)
    }
    assert gap[5.0] > gap[1.0]
    assert clump_size(1.0) == 1.0
    assert clump_size(9.0) == 5.0


def test_clumped_arrivals_keep_it_off_a_mix_that_poisson_ones_at_their_rate_allow() -> None:
    """5 requests at once every 5 s (1/s): Poisson arrivals at 1/s let the most accurate
    member (250 ms) serve, but a clump of 5 on it takes 1.25 s and its last requests miss,
    where the fastest clears it in 0.5 s. The rate between clumps is still read as 1/s, not as
    the lull it looks like to a Poisson test."""
    smooth, _, _ = steady_run(Predictive(PLAN), qps=1.0, seconds=60)
    assert smooth == MOST_ACCURATE
    # Past the first minute's evidence: a Poisson reading swung between the most accurate
    # member in each lull and a fast mix after each clump.
    late = clumped_run(Predictive(PLAN), clump=5, every=5, seconds=60)[-20:]
    assert all(d.mix.position < MOST_ACCURATE.position for d in late)
    assert len({d.mix for d in late}) <= 2
    assert all("in clumps of" in d.reason for d in late)
    rates = [float(d.reason.split("forecast ")[1].split("/s")[0]) for d in late]
    assert min(rates) > 0.9


def test_policies_on_one_front_share_its_draws_however_its_profiles_were_made() -> None:
    """The draws are shared by what they are drawn from, not by the profile objects as they
    stand: a used plan and a fresh plan of the same front, its configurations' keys in another
    order (a plan parsed from JSON, one from a spec), share one set; another front gets its own."""

    def curved(member: LatencyProfile, order: int) -> LatencyProfile:
        drain = 1000 / member.mean_ms
        points = (
            CurvePoint(drain / 2, drain / 2, member.mean_ms, ((50.0, member.mean_ms),)),
            CurvePoint(2 * drain, drain, 5000.0, ((50.0, 5000.0),), growing=True),
        )
        items = [("model", member.name), ("k", 1)]
        config = dict(items if order == 0 else reversed(items))
        return dataclasses.replace(member, config=config, capacity=CapacityCurve(1, points))

    def plan_of(members: list[LatencyProfile]) -> Plan:
        return plan_thresholds(members, Slo(1000), 50, ThresholdModel.TAIL)

    used = Predictive(plan_of([curved(m, 0) for m in FRONT]))
    steady_run(used, qps=3.0, seconds=10)
    fresh = Predictive(plan_of([curved(m, 1) for m in FRONT]))
    assert fresh.paths is used.paths
    slower = [curved(replace(m, mean_ms=m.mean_ms * 2), 0) for m in FRONT]
    assert Predictive(plan_of(slower)).paths is not used.paths


def test_an_idle_counter_reads_as_no_dispersion_and_one_that_moved_is_measured() -> None:
    idle = [(float(t), 7.0) for t in range(130)]
    assert arrivals_dispersion(idle, 129.0) == 1.0
    # Clumps in its last minute: measured, not taken for an idle counter.
    moved = [(t, total + 40.0 * (t > 70) * (t // 5 - 14)) for t, total in idle]
    assert arrivals_dispersion(moved, 129.0) > 5.0
