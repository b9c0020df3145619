"""Late binding: the per-stage decision, the follower spare, the per-stage times, and the
simulator that binds each request stage by stage."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from compass.domain.admission import Admission
from compass.domain.arrivals import (
    Scenario,
    SimulationError,
    make_pattern,
    make_scenario,
    trace_pattern,
)
from compass.domain.binding import (
    BindableConfig,
    BindingError,
    BindingVerdict,
    StagePlan,
    bind_stage,
    fit_stage_times,
    router_table,
    stage_plan,
    stage_shares,
)
from compass.domain.boundpod import BindingRule, RateView, bound_pods
from compass.domain.podmodel import PodModel, Stage
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import RunReport, StaticController, simulate
from compass_rules.binding import waited_long
from compass_rules.followers import (
    follower_slacks_ms,
    joint_spare_ms,
    lag_room_ms,
    polled_followers_left_ms,
    static_schedule,
)

STAGES = (("k",), ("model",))


def follower_spare_ms(*args: Any, **kwargs: Any) -> float:
    """The least of the counted follower slacks: what a request may spend (inf: none count)."""
    return min((s for s in follower_slacks_ms(*args, **kwargs) if s is not None), default=math.inf)


def entry(k: int, model: str, accuracy: float, first_ms: float, second_ms: float) -> BindableConfig:
    """A two-stage configuration: a retriever's k, then a generator model."""
    return BindableConfig({"k": k, "model": model}, accuracy, (first_ms, second_ms))


# Two ks, two models; the big model only with k 20 (k 10 + big is not allowed).
PLAN = StagePlan(
    STAGES,
    (
        entry(10, "small", 0.70, 20, 80),
        entry(20, "small", 0.75, 40, 80),
        entry(20, "big", 0.90, 40, 400),
    ),
)
IDLE = (0.0, 0.0)


def test_a_request_with_time_to_spare_heads_for_the_most_accurate_configuration() -> None:
    binding = bind_stage(PLAN, 0, {}, left_ms=1000, backlog_ms=IDLE)
    assert (binding.config, binding.verdict) == (2, BindingVerdict.FITS)
    assert binding.remaining_ms == pytest.approx(440)


def test_a_queue_at_a_later_component_counts_against_the_deadline() -> None:
    # 440 ms fits 500 alone; 100 ms queued at the generator does not leave room for it.
    assert bind_stage(PLAN, 0, {}, 500, IDLE).config == 2
    assert bind_stage(PLAN, 0, {}, 500, (0.0, 100.0)).config == 1


def test_the_next_stage_binds_among_configurations_consistent_with_the_first() -> None:
    # Bound k 20; at the generator with 200 ms left only the small model fits.
    binding = bind_stage(PLAN, 1, {"k": 20}, 200, IDLE)
    assert (binding.config, binding.verdict) == (1, BindingVerdict.FITS)
    # Bound k 10, the big model is not consistent even with all the time in the world.
    assert bind_stage(PLAN, 1, {"k": 10}, 10_000, IDLE).config == 0


def test_when_nothing_fits_the_fastest_completion_and_refusal_only_if_asked() -> None:
    late = bind_stage(PLAN, 0, {}, 50, IDLE)
    assert (late.config, late.verdict) == (0, BindingVerdict.FASTEST)
    refused = bind_stage(PLAN, 0, {}, 50, IDLE, refuse=True)
    assert (refused.config, refused.verdict) == (None, BindingVerdict.REFUSED)
    # Refusal is for what is late whatever serves it: the fastest fits here, so it serves.
    spared = bind_stage(PLAN, 0, {}, 150, IDLE, spare_ms=0, refuse=True)
    assert (spared.config, spared.verdict) == (0, BindingVerdict.FITS)


def test_the_spare_for_followers_caps_the_extra_time_over_the_fastest() -> None:
    # Fastest 100 ms; k 20 small takes 20 more, k 20 big 340 more.
    assert bind_stage(PLAN, 0, {}, 1000, IDLE, spare_ms=339).config == 1
    assert bind_stage(PLAN, 0, {}, 1000, IDLE, spare_ms=340).config == 2
    assert bind_stage(PLAN, 0, {}, 1000, IDLE, spare_ms=19).config == 0


def test_a_stage_bound_before_its_request_reaches_it_counts_the_stages_still_ahead() -> None:
    # A pipeline that reads every parameter at dispatch binds the generator while the
    # retriever is still ahead: with 420 ms left the big model fits the generator's 400 ms
    # alone, not the 440 ms the request has still to go.
    assert bind_stage(PLAN, 1, {"k": 20}, 420, IDLE).config == 2
    assert bind_stage(PLAN, 1, {"k": 20}, 420, IDLE, at=0).config == 1
    with pytest.raises(BindingError, match="at"):
        bind_stage(PLAN, 0, {}, 420, IDLE, at=1)


def test_the_slow_loop_allows_a_subset_and_the_fastest_stays_the_fallback() -> None:
    assert bind_stage(PLAN, 0, {}, 1000, IDLE, allowed=[1]).config == 1
    assert bind_stage(PLAN, 0, {}, 1000, IDLE, allowed=[]).config == 0


def test_bad_input_names_the_field() -> None:
    with pytest.raises(BindingError, match="bound"):
        bind_stage(PLAN, 1, {"k": 5}, 100, IDLE)
    with pytest.raises(BindingError, match="backlog_ms"):
        bind_stage(PLAN, 0, {}, 100, (0.0,))
    with pytest.raises(BindingError, match="stage"):
        bind_stage(PLAN, 2, {}, 100, IDLE)
    with pytest.raises(BindingError, match=r"binding.configs\[0\]"):
        StagePlan(STAGES, (BindableConfig({"k": 1}, 0.5, (1.0, 1.0)),))
    with pytest.raises(BindingError, match="stage_ms"):
        StagePlan(STAGES, (BindableConfig({"k": 1, "model": "m"}, 0.5, (1.0,)),))


def test_followers_that_would_be_in_time_limit_the_spare_and_late_ones_do_not() -> None:
    # Own fastest 100 ms; followers take 100 ms each. The first follower finishes at 200 with
    # 500 left: 300 spare; the second at 300 with 350 left: 50 spare.
    assert follower_spare_ms(100, [500, 350], 100) == pytest.approx(50)
    # A follower already late at the fastest is left out.
    assert follower_spare_ms(100, [500, 150], 100) == pytest.approx(300)
    assert follower_spare_ms(100, [], 100) == math.inf
    # A follower in time at the likely (median) times but not at the cautious ones leaves none.
    assert follower_spare_ms(100, [190], 100, likely=(80, 80)) == 0
    assert follower_spare_ms(100, [190], 100, likely=(150, 150)) == math.inf
    # Two instances: followers see half the work ahead, and extra time delays them by half.
    assert follower_spare_ms(100, [350], 100, servers=2) == pytest.approx(2 * (350 - 150))


def test_each_followers_slack_is_given_and_the_spare_is_the_least_counted() -> None:
    assert follower_slacks_ms(100, [500, 350, 150], 100) == [
        pytest.approx(300),
        pytest.approx(50),
        None,
    ]
    assert follower_slacks_ms(100, [], 100) == []


# (extra ms over the fastest, accuracy): the fastest, a little slower, much slower.
OPTIONS = [(0.0, 0.80), (6.0, 0.82), (40.0, 0.84)]


def test_the_joint_plan_spreads_slack_over_followers_where_that_serves_more_accuracy() -> None:
    # Three followers with 40 ms each: the request alone could take the 40 ms member, but
    # then no follower gains; four of the 6 ms member serve more accuracy in all.
    assert follower_spare_ms(0, [40, 40, 40], 0) == 40
    assert joint_spare_ms(OPTIONS, OPTIONS, [40, 40, 40]) == pytest.approx(6)
    # One follower with 100 ms: both can take the slow member.
    assert joint_spare_ms(OPTIONS, OPTIONS, [100]) == pytest.approx(40)
    # A follower that does not count constrains nothing, and neither do none.
    assert joint_spare_ms(OPTIONS, OPTIONS, [40, None, 40]) == pytest.approx(6)
    assert joint_spare_ms(OPTIONS, OPTIONS, [None]) == math.inf
    assert joint_spare_ms(OPTIONS, OPTIONS, []) == math.inf
    # No slack: nothing to spend.
    assert joint_spare_ms(OPTIONS, OPTIONS, [3]) == 0


def test_the_joint_plan_keeps_its_extra_time_within_the_lag_budget_and_the_request_first() -> None:
    # Ten ms of lag in all: one 6 ms member fits, and between it going to the request or to
    # a follower the request takes it (its choice is sure, the followers' plans are not).
    assert joint_spare_ms(OPTIONS, OPTIONS, [40, 40, 40], budget_ms=10) == pytest.approx(6)
    assert joint_spare_ms(OPTIONS, OPTIONS, [40, 40, 40], budget_ms=5) == 0
    # Two servers: the request's extra delays a follower by half, the follower's own counts
    # in full, so against its (doubled) slack its own counts twice: with one server both
    # take 40 ms more; with two only one can, and the follower's member is worth more.
    follower = [(0.0, 0.80), (40.0, 0.90)]
    assert joint_spare_ms(OPTIONS, follower, [82]) == pytest.approx(40)
    assert joint_spare_ms(OPTIONS, follower, [82], servers=2) == 0
    with pytest.raises(ValueError, match="servers"):
        joint_spare_ms(OPTIONS, OPTIONS, [40], servers=0)


def profile(config: dict[str, object], mean: float, accuracy: float) -> LatencyProfile:
    """A profile whose percentiles spread 10% around its mean."""
    return LatencyProfile(
        config,  # type: ignore[arg-type]
        accuracy,
        mean,
        mean * 1.16,
        p50_ms=mean,
        p99_ms=mean * 1.23,
        std_ms=mean * 0.1,
    )


# Additive per-stage times: k 10 -> 20 ms, k 20 -> 60 ms; small 100 ms, big 400 ms.
ADDITIVE = [
    profile({"k": k, "model": m}, kt + mt, acc)
    for (k, kt), (m, mt), acc in (
        ((10, 20), ("small", 100), 0.70),
        ((20, 60), ("small", 100), 0.75),
        ((10, 20), ("big", 400), 0.85),
        ((20, 60), ("big", 400), 0.90),
    )
]


def test_stage_times_recover_each_stages_own_differences_and_keep_each_total() -> None:
    times = fit_stage_times(ADDITIVE, STAGES, prior_shares=(0.2, 0.8))
    # What end-to-end times identify: k 20 costs 40 ms more than k 10, big 300 more than small.
    assert times[1][0] - times[0][0] == pytest.approx(40, abs=0.5)
    assert times[2][1] - times[0][1] == pytest.approx(300, abs=0.5)
    # Each stage's time depends on its own parameter only.
    assert times[0][1] == pytest.approx(times[1][1])
    assert times[0][0] == pytest.approx(times[2][0])
    for p, stage_times in zip(ADDITIVE, times, strict=True):
        assert sum(stage_times) == pytest.approx(p.mean_ms, abs=0.5)
    # What they leave open leans to the prior: the first stage's share of the mean grows with it.
    leaning = fit_stage_times(ADDITIVE, STAGES, prior_shares=(0.4, 0.6))
    assert leaning[0][0] > times[0][0] + 50
    assert leaning[1][0] - leaning[0][0] == pytest.approx(40, abs=0.5)
    plan = stage_plan(ADDITIVE, STAGES)
    for p, config in zip(ADDITIVE, plan.configs, strict=True):
        assert config.total_ms == pytest.approx(float(p.distribution.quantile(0.5)))
    for split in stage_shares(ADDITIVE, STAGES):
        assert sum(split) == pytest.approx(1)


def test_measured_component_times_split_each_configuration_where_every_profile_has_them() -> None:
    # Profiling timed each component: the retriever's share is what was measured, not the
    # fit's (which would lean to the prior), and the router's own time goes pro rata.
    measured = [
        replace(p, component_ms={"retriever": 0.3 * p.mean_ms, "generator": 0.6 * p.mean_ms})
        for p in ADDITIVE
    ]
    for split in stage_shares(measured, STAGES, (0.9, 0.1), ("retriever", "generator")):
        assert split == pytest.approx((1 / 3, 2 / 3))
    plan = stage_plan(measured, STAGES, components=("retriever", "generator"))
    for p, config in zip(measured, plan.configs, strict=True):
        assert config.total_ms == pytest.approx(float(p.distribution.quantile(0.5)))
        assert config.stage_ms[0] == pytest.approx(config.total_ms / 3)
    # One profile without them (profiled before), or a stage's model not timed: the fit, as
    # without component times at all.
    fitted = stage_shares(ADDITIVE, STAGES, (0.9, 0.1))
    partial = [*measured[:3], ADDITIVE[3]]
    assert stage_shares(partial, STAGES, (0.9, 0.1), ("retriever", "generator")) == fitted
    assert stage_shares(measured, STAGES, (0.9, 0.1), ("retriever", "reranker")) == fitted
    with pytest.raises(BindingError, match="components: 1 component models for 2 stages"):
        stage_plan(measured, STAGES, components=("retriever",))


def test_a_stage_that_calls_several_models_takes_their_times_together() -> None:
    # qa-real's retrieval calls bm25, dense or both: each configuration's first stage is the
    # models it called (a model it did not call is not in its times), the reader the second.
    retrieve = ("bm25", "dense")
    calls = [
        {"bm25": 10.0, "reader": 30.0},
        {"dense": 25.0, "reader": 30.0},
        {"bm25": 10.0, "dense": 25.0, "reader": 60.0},
        {"bm25": 10.0, "reader": 60.0},
    ]
    measured = [replace(p, component_ms=c) for p, c in zip(ADDITIVE, calls, strict=True)]
    expected = [(10 / 40, 30 / 40), (25 / 55, 30 / 55), (35 / 95, 60 / 95), (10 / 70, 60 / 70)]
    shares = stage_shares(measured, STAGES, None, (retrieve, "reader"))
    for split, share in zip(shares, expected, strict=True):
        assert split == pytest.approx(share)
    plan = stage_plan(measured, STAGES, components=(retrieve, "reader"))
    hybrid = plan.configs[2]
    assert hybrid.total_ms == pytest.approx(float(measured[2].distribution.quantile(0.5)))
    assert hybrid.stage_ms[0] == pytest.approx(hybrid.total_ms * 35 / 95)
    # One configuration that called none of a stage's models: no split measured, the fit.
    unmeasured = [*measured[:3], replace(ADDITIVE[3], component_ms={"reader": 60.0})]
    assert stage_shares(unmeasured, STAGES, None, (retrieve, "reader")) == stage_shares(
        ADDITIVE, STAGES
    )
    # The router's table: a list where a stage may call several, one model a stage a string.
    table = router_table(plan, (retrieve, ("reader",)))
    assert table["components"] == [["bm25", "dense"], "reader"]
    with pytest.raises(BindingError, match=r"components: .* names one twice"):
        router_table(plan, (retrieve, ("reader", "dense")))
    with pytest.raises(BindingError, match="without a model"):
        router_table(plan, (retrieve, ()))
    # The settle at a free pipeline: none unless asked, a few ms at most MAX_SETTLE_MS.
    assert table["settle_ms"] == 0.0
    assert router_table(plan, (retrieve, ("reader",)), settle_ms=3.0)["settle_ms"] == 3.0
    for bad in (-1.0, 100.5, math.nan):
        with pytest.raises(BindingError, match="settle_ms"):
            router_table(plan, (retrieve, ("reader",)), settle_ms=bad)


def test_stage_shares_name_a_missing_parameter() -> None:
    with pytest.raises(BindingError, match="lacks model"):
        stage_shares([profile({"k": 10}, 100, 0.7)], STAGES)
    with pytest.raises(BindingError, match="prior_shares"):
        stage_shares(ADDITIVE, STAGES, prior_shares=(0.5, 0.6))


def rule(**knobs: Any) -> BindingRule:
    """The routers' rule over STAGES, split by the profiles alone."""
    return BindingRule(stages=STAGES, prior_shares=None, **knobs)


def served_bound(
    front: Sequence[LatencyProfile],
    load: Scenario,
    slo_ms: float,
    binding: BindingRule | None = None,
    pod_model: PodModel = PodModel(),
) -> RunReport:
    """The front served with the routers binding every request (the simulator's rule hook)."""
    return simulate(binding or rule(), front, load, slo_ms, pod_model=pod_model)


def scenario(qps: float, seed: int = 0, kind: str = "constant") -> object:
    return make_scenario(make_pattern(kind, qps, 120.0, seed=seed), seed)


def test_a_request_that_keeps_one_configuration_takes_what_the_static_run_gives_it() -> None:
    one = [ADDITIVE[3]]
    load = scenario(1.0)
    bound = served_bound(one, load, 10_000)  # type: ignore[arg-type]
    static = simulate(StaticController(one[0].name, 0), one, load, 10_000)  # type: ignore[arg-type]
    np.testing.assert_allclose(bound.finishes_s, static.finishes_s)
    np.testing.assert_allclose(bound.starts_s, static.starts_s)


def test_the_routers_own_work_lengthens_each_bound_requests_turn_in_the_pipeline() -> None:
    """BindingRule.decision_s: a lone request ends that much later; queued ones inherit
    it, each later by at least as much; a negative time is refused by name."""
    one = [ADDITIVE[3]]
    load = scenario(1.0)

    def served(decision_s: float) -> np.ndarray:
        settings = rule(decision_s=decision_s)
        bound = served_bound(one, load, 10_000, settings)  # type: ignore[arg-type]
        return bound.finishes_s

    free, costly = served(0.0), served(0.05)
    assert costly[0] - free[0] == pytest.approx(0.05)
    assert np.all(costly - free >= 0.05 - 1e-9)
    assert np.any(costly - free > 0.05 + 1e-6)  # a queue carried the cost forward
    with pytest.raises(SimulationError, match="decision_s"):
        served(-0.001)


# The slow loop's rate limits (requests/s) per ADDITIVE configuration: the fastest has none.
LIMITS = (None, 4.0, 2.0, 1.5)


def test_binding_serves_the_accurate_configuration_when_idle_and_the_fast_one_when_loaded() -> None:
    slo = 600.0
    settings = rule(max_qps=LIMITS)
    light = served_bound(
        ADDITIVE,
        scenario(0.2),  # type: ignore[arg-type]
        slo,
        settings,
    )
    heavy_load = scenario(6.0)
    heavy = served_bound(
        ADDITIVE,
        heavy_load,  # type: ignore[arg-type]
        slo,
        settings,
    )
    assert light.mean_accuracy > 0.88
    assert heavy.mean_accuracy < light.mean_accuracy - 0.05
    fastest = simulate(
        StaticController(ADDITIVE[0].name, 0),
        ADDITIVE,
        heavy_load,  # type: ignore[arg-type]
        slo,
    )
    # Loaded beyond every limit but the fastest's, it keeps the SLO about as often as it.
    assert heavy.compliance >= fastest.compliance - 1
    # Without the limits each request looks only at the queue it finds, and the next burst
    # finds the queue its accurate predecessors left.
    greedy = served_bound(
        ADDITIVE,
        heavy_load,  # type: ignore[arg-type]
        slo,
    )
    assert greedy.compliance < heavy.compliance - 5


def test_the_rate_counts_what_the_router_can_see_of_a_clump_queued_in_front_of_it() -> None:
    # Eight requests arrive at once after a lull of 2.5 s, then one alone at 6 s, all with the
    # time they need.
    arrivals = np.array([0.0] + [2.5] * 8 + [6.0])
    load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(len(arrivals), 0.5))

    def served(view: RateView) -> list[int]:
        settings = rule(max_qps=LIMITS, rate_view=view)
        report = served_bound(ADDITIVE, load, 60_000, settings)
        return [int(c) for c in report.configs]

    # A router that held its queue would see all eight at once, over the accurate ones'
    # limits; the live router sees each as it takes it up, so the clump's first go on the
    # most accurate, until those taken up count over its limit.
    held = served(RateView.ARRIVALS)
    assert max(held[1:9]) <= 1
    seen = served(RateView.TAKEN_ARRIVALS)
    assert seen[1] == 3
    assert seen[8] <= 1
    # The lone request after the clump: counted by arrival, the clump is 3.5 s behind it and
    # out of the 2 s window; counted as taken up, the clump's last take-ups still are in it.
    assert held[9] == seen[9] == 3
    assert served(RateView.DISPATCHES)[9] < 3


def test_a_request_that_waited_long_for_an_instance_binds_the_fastest_completion() -> None:
    # Three arrive at once with a second each: the first finds the pod idle and takes the most
    # accurate; the next two wait for it, over a quarter of the SLO, and so (admission's
    # degradeAfter) take the fastest, where without the rule each takes what its own
    # deadline allows.
    arrivals = np.zeros(3)
    load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(3, 0.5))

    def served(degrade_after: float | None) -> list[int]:
        report = served_bound(
            ADDITIVE,
            load,
            1000,
            rule(degrade_after=degrade_after),
        )
        return [int(c) for c in report.configs]

    assert served(0.25) == [3, 0, 0]
    assert served(None)[:2] == [3, 3]
    assert waited_long(251, 1000, 0.25)
    assert not waited_long(250, 1000, 0.25)
    with pytest.raises(SimulationError, match="degrade_after"):
        served(0.0)


def test_refusal_drops_only_at_the_first_stage_and_frees_the_queue() -> None:
    load = scenario(12.0)
    slo = 400.0
    kept = served_bound(ADDITIVE, load, slo)  # type: ignore[arg-type]
    refused = served_bound(
        ADDITIVE,
        load,  # type: ignore[arg-type]
        slo,
        rule(refuse=True),
    )
    assert kept.dropped_pct == 0
    assert refused.dropped_pct > 0
    assert refused.compliance > kept.compliance


def test_batching_components_and_router_instances_serve_every_request() -> None:
    pod = PodModel(servers=4, stages=(Stage(0.3), Stage(0.7, max_batch=8, batch_cost=0.25)))
    report = served_bound(
        ADDITIVE,
        scenario(8.0),  # type: ignore[arg-type]
        1000,
        BindingRule(STAGES, (0.2, 0.8), max_qps=(None, 16.0, 8.0, 6.0)),
        pod,
    )
    assert not np.isnan(report.finishes_s).any()
    assert (report.finishes_s >= report.starts_s).all()
    assert report.compliance > 50


def test_static_fastests_schedule_and_the_lag_a_request_may_take_behind_it() -> None:
    # Lindley's recursion: a request waits for the one before it, never for an idle queue.
    assert static_schedule(1.0, 0.5, 0.1) == (1.0, pytest.approx(1.1))
    assert static_schedule(1.0, 1.3, 0.1) == (1.3, pytest.approx(1.4))
    # 100 ms behind static fastest at its fastest, 250 allowed: 150 more; beyond the cap none.
    assert lag_room_ms(250, 1100 - 1000) == pytest.approx(150)
    assert lag_room_ms(250, 1400 - 1000) == 0
    assert lag_room_ms(250, 900 - 1000) == pytest.approx(350)


def test_the_lag_cap_keeps_every_request_within_it_of_static_fastests_schedule() -> None:
    # Four lone requests, each arriving while the one before is served, then a clump: with no
    # cap, each takes what its own deadline allows and the busy period it makes runs on; the
    # cap holds every request within it of when static fastest would end it (median luck and
    # narrow profiles: the predicted times are the times).
    arrivals = np.array([0.0, 0.3, 0.6, 0.9] + [1.0] * 7)
    load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(len(arrivals), 0.5))
    slo, share = 1200.0, 0.3
    static = simulate(StaticController(ADDITIVE[0].name, 0), ADDITIVE, load, slo)  # type: ignore[arg-type]

    def lags(settings: BindingRule) -> np.ndarray:
        report = served_bound(ADDITIVE, load, slo, settings)
        assert report.dropped_pct == 0
        return (report.finishes_s - static.finishes_s) * 1000

    assert lags(rule()).max() > share * slo + 100
    capped = lags(rule(lag_share=share))
    assert capped.max() <= share * slo + 1e-6
    # With a reserve of two of the fastest's services (120 ms each), the share is of what is
    # left of the SLO after them: a tighter cap, and one that binds.
    reserved = lags(rule(lag_share=share, lag_reserve=2))
    assert reserved.max() <= share * (slo - 2 * 120) + 1e-6 < capped.max()
    with pytest.raises(SimulationError, match="lag_share"):
        lags(rule(lag_share=1.5))
    with pytest.raises(SimulationError, match="lag_reserve"):
        lags(rule(lag_share=share, lag_reserve=-1))


def test_followers_counted_by_a_poll_are_spared_once_the_poll_has_seen_them() -> None:
    # Four arrive at once with 700 ms each: only sparing the three behind it keeps the first
    # off the most accurate (460 ms), and all four in time.
    def served(at_s: float, settings: BindingRule) -> tuple[list[int], float]:
        arrivals = np.full(4, at_s)
        load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(4, 0.5))
        report = served_bound(ADDITIVE, load, 700, settings)
        return [int(c) for c in report.configs], report.compliance

    blind = rule()
    held = rule(spare_followers=True)
    polled = rule(spare_followers=True, followers_poll_s=0.05)
    assert served(0.01, blind) == ([3, 1, 0, 0], 50.0)
    assert served(0.01, held) == ([1, 1, 1, 1], 100.0)
    # Polled every 50 ms: the clump at 0.01 s is not seen at the first take-up (the last poll
    # was at 0), only at the next one; a clump at a poll's own time is seen at once.
    assert served(0.01, polled) == ([3, 0, 0, 0], 75.0)
    assert served(0.0, polled) == ([1, 1, 1, 1], 100.0)
    assert polled_followers_left_ms(3, 250.0) == [250.0] * 3
    assert polled_followers_left_ms(-1, 250.0) == []
    with pytest.raises(SimulationError, match="followers_poll_s"):
        served(0.0, rule(spare_followers=True, followers_poll_s=0.0))


def test_a_gate_shows_the_followers_waiting_at_it_and_not_those_behind() -> None:
    # Four at once with 600 ms each, arriving between polls: a request bound at the gate sees
    # the followers waiting at it with their deadlines, at once; those behind a full gate
    # wait in Triton's queue, unseen, since a gated router polls nothing.
    def served(at_s: float, visible: int, poll_s: float | None = None) -> tuple[list[int], float]:
        arrivals = np.full(4, at_s)
        load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(4, 0.5))
        settings = rule(
            spare_followers=True,
            followers_poll_s=poll_s,
            visible_followers=visible,
        )
        report = served_bound(ADDITIVE, load, 600, settings)
        return [int(c) for c in report.configs], report.compliance

    # A gate of four instances (three waiting): every follower seen, every one in time.
    assert served(0.01, 3) == ([1, 1, 0, 1], 100.0)
    # A gate of two: one follower seen, so the first plans with it alone, and the two in
    # Triton's queue are unseen (late) even where a poll at their arrival would have counted
    # them.
    assert served(0.01, 1) == ([3, 0, 0, 0], 50.0)
    assert served(0.0, 1) == ([3, 0, 0, 0], 50.0)
    with pytest.raises(SimulationError, match="visible_followers"):
        served(0.0, -1)
    with pytest.raises(SimulationError, match="followers_poll_s"):
        served(0.0, 1, 0.05)


def test_the_first_at_a_free_pipeline_settles_and_sees_the_burst_it_leads() -> None:
    # The four of the gate test, sent 1 ms apart (as a client's burst reaches a pod): the
    # first finds the pipeline free. At once it binds alone, as the router did; settling
    # 5 ms first it sees the other three at the gate, as when they arrive together.
    def served(settle_s: float, gap_s: float = 0.001) -> tuple[list[int], float, float]:
        arrivals = 0.01 + gap_s * np.arange(4)
        load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(4, 0.5))
        settings = rule(spare_followers=True, visible_followers=3, settle_s=settle_s)
        report = served_bound(ADDITIVE, load, 700, settings)
        return [int(c) for c in report.configs], report.compliance, float(report.starts_s[0])

    assert served(0.0, gap_s=0.0)[:2] == ([1, 1, 1, 1], 100.0)
    configs, compliance, _ = served(0.0)
    assert configs[0] == 3
    assert compliance < 100.0
    configs, compliance, start = served(0.005)
    assert (configs, compliance) == ([1, 1, 1, 1], 100.0)
    assert start == pytest.approx(0.015)
    # A lone request settles too (its start is that much later), and nothing else changes.
    assert served(0.005, gap_s=1.0)[2] == pytest.approx(0.015)
    with pytest.raises(SimulationError, match="settle_s"):
        served(-0.001)


def test_a_request_at_the_gate_plans_with_those_waiting_behind_it() -> None:
    # Four at once, SLO 790 ms: alone, the first could take k 10 + big (300 ms more, all the
    # slack the followers leave) and the rest the fastest (0.85 + 3 x 0.70); planned together,
    # each takes k 20 + small (40 ms more each), 3.0 in all, and every one stays in time.
    arrivals = np.zeros(4)
    load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(4, 0.5))
    settings = rule(spare_followers=True, visible_followers=3)
    report = served_bound(ADDITIVE, load, 790, settings)
    assert follower_spare_ms(120, [790, 790, 790], 120) == pytest.approx(310)
    assert ([int(c) for c in report.configs], report.compliance) == ([1, 1, 1, 1], 100.0)


def test_a_gated_router_counts_the_arrivals_it_took_up_as_they_come() -> None:
    # The clump of the rate test: eight at once after a lull, one alone at 6 s.
    arrivals = np.array([0.0] + [2.5] * 8 + [6.0])
    load = Scenario(trace_pattern(arrivals), 0, arrivals, np.full(len(arrivals), 0.5))

    def served(visible: int | None, view: RateView) -> list[int]:
        settings = rule(max_qps=LIMITS, rate_view=view, visible_followers=visible)
        report = served_bound(ADDITIVE, load, 60_000, settings)
        return [int(c) for c in report.configs]

    # Eight instances take the whole clump up at once: the rate counts it as it came.
    assert served(7, RateView.GATE_ARRIVALS) == served(None, RateView.ARRIVALS)
    # Three take up three: the first is bound on those alone, the next once one more is in.
    narrow = served(2, RateView.GATE_ARRIVALS)
    assert narrow[1] == 3
    assert narrow[2] < 3
    assert narrow[2] > served(7, RateView.GATE_ARRIVALS)[2]
    with pytest.raises(SimulationError, match="rate_view"):
        served(None, RateView.GATE_ARRIVALS)


def test_a_bound_pod_serves_the_same_advanced_tick_by_tick_as_at_once() -> None:
    """The one run loop advances bound pods tick by tick; what they serve must not depend on
    where it stops (the rule sees the pod as it is at each event, never at a tick)."""
    load = scenario(6.0, kind="bursty")
    arrivals = load.arrivals_s  # type: ignore[attr-defined]
    service_s = np.stack([p.distribution.quantile(load.luck) / 1000 for p in ADDITIVE])  # type: ignore[attr-defined]
    gated = rule(spare_followers=True, visible_followers=3, settle_s=0.003, lag_share=0.3)

    def served(stops: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(arrivals)
        record = (np.empty(n), np.empty(n), np.empty(n, dtype=np.int64))
        queues = [np.arange(n)]
        [pod] = bound_pods(gated, ADDITIVE, PodModel(), 600, queues, arrivals, service_s, record)
        for until in stops:
            pod.advance(until)
        pod.drain()
        assert pod.done
        return record

    at_once, ticked = served(()), served(np.arange(0.0, 130.0, 0.37).tolist())
    for whole, stepped in zip(at_once, ticked, strict=True):
        np.testing.assert_array_equal(whole, stepped)


def test_a_binding_rule_serves_alone_and_admission_beside_it_is_refused_by_name() -> None:
    load = scenario(1.0)
    report = served_bound(ADDITIVE, load, 600)  # type: ignore[arg-type]
    assert (report.ticks, report.switches) == ((), 0)
    with pytest.raises(SimulationError, match="admission"):
        simulate(rule(), ADDITIVE, load, 600, admission=Admission(600))  # type: ignore[arg-type]
