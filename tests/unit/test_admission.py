"""Proactive admission: the latency prediction, the verdicts, and admission in the simulator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from compass.domain.admission import (
    Admission,
    AdmissionError,
    AdmissionPoint,
    AdmissionVerdict,
    ServiceGrid,
    judge,
    judge_at_dispatch,
    predicted_latency_ms,
    router_admission,
    service_quantiles_ms,
)
from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.podmodel import RAG_SIM_STAGES, PodModel
from compass.domain.simulator import StaticController, simulate
from compass_dev.scenarios import normal_profile as profile
from compass_dev.sim_capacity import measure_capacity

FAST = profile("fast", 0.70, 100, 10)
SLOW = profile("slow", 0.90, 300, 30)
FRONT = [FAST, SLOW]


def test_the_grid_keeps_the_profiles_mean_and_weights_a_mix_by_its_shares() -> None:
    fast, slow = ServiceGrid([(FAST, 1.0)]), ServiceGrid([(SLOW, 1.0)])
    assert fast.mean_ms == pytest.approx(100, rel=0.01)
    assert slow.quantile_ms(0.5) == pytest.approx(300, rel=0.01)
    mix = ServiceGrid([(FAST, 0.75), (SLOW, 0.25)])
    assert mix.mean_ms == pytest.approx(0.75 * fast.mean_ms + 0.25 * slow.mean_ms)
    # A quarter of the mix is the slow member: its 80th percentile is past every fast point.
    assert mix.quantile_ms(0.5) < 150 < mix.quantile_ms(0.8)


def test_the_residual_time_is_what_is_left_given_how_long_it_ran() -> None:
    grid = ServiceGrid([(SLOW, 1.0)])
    assert grid.residual_ms(0) == pytest.approx(grid.mean_ms)
    # Past its mean a request is expected to run on, less than the mean, more than nothing.
    assert 0 < grid.residual_ms(310) < 50
    assert grid.residual_ms(10_000) == 0


def test_the_prediction_is_the_wait_for_an_instance_plus_its_own_service() -> None:
    grid = ServiceGrid([(FAST, 1.0)])
    # An idle instance: no wait.
    assert predicted_latency_ms(grid, 0, [], 1, 100) == 100
    assert predicted_latency_ms(grid, 1, [50, 50], 4, 100) == 100
    # Two ahead take the two idle instances: it waits for a share of the work.
    assert predicted_latency_ms(grid, 2, [50, 50], 4, 100) > 100
    # One instance, busy 0 ms with 3 queued ahead: four mean services, then its own.
    assert predicted_latency_ms(grid, 3, [0], 1, 100) == pytest.approx(4 * grid.mean_ms + 100)
    # Four instances share the work ahead.
    assert predicted_latency_ms(grid, 3, [0] * 4, 4, 100) == pytest.approx(
        (4 + 3) * grid.mean_ms / 4 + 100
    )


def test_a_request_is_served_degraded_to_the_fastest_or_dropped_by_its_prediction() -> None:
    slow, fast = ServiceGrid([(SLOW, 1.0)]), ServiceGrid([(FAST, 1.0)])
    rule = Admission(slo_ms=1000)
    # Behind one slow request just started: 300 wait + 300 service fits.
    assert judge(rule, slow, fast, 0, [0], 1) is AdmissionVerdict.SERVE
    # Two queued behind it: 900 wait; 300 more does not fit, 100 on the fastest does.
    assert judge(rule, slow, fast, 2, [0], 1) is AdmissionVerdict.FASTEST
    # Three queued: 1200 of wait, nothing fits.
    assert judge(rule, slow, fast, 3, [0], 1) is AdmissionVerdict.DROP
    # Refusing nothing: what nothing brings in time goes to the fastest.
    assert judge(Admission(1000, refuse=False), slow, fast, 3, [0], 1) is AdmissionVerdict.FASTEST


@pytest.mark.parametrize(
    ("slo", "quantile", "field"), [(0, 0.5, "slo_ms"), (500, 1.0, "quantile"), (500, 0, "quantile")]
)
def test_bad_admission_settings_name_the_field(slo: float, quantile: float, field: str) -> None:
    with pytest.raises(AdmissionError, match=field):
        Admission(slo, quantile)


def spike(seed: int = 3) -> object:
    return make_scenario(make_pattern("spike", 2.5, 240, seed=seed), seed)


@pytest.mark.parametrize("pod_model", [PodModel(), PodModel(2, RAG_SIM_STAGES)])
def test_admission_that_refuses_nothing_changes_nothing(pod_model: PodModel) -> None:
    """An SLO no prediction exceeds admits every request: the run is the run without admission."""
    scenario = spike()
    runs = [
        simulate(
            StaticController("slow", 1), FRONT, scenario, 1000, pod_model=pod_model, admission=rule
        )
        for rule in (None, Admission(slo_ms=1e12))
    ]
    assert not runs[1].dropped.any()
    for a, b in zip(runs[0].finishes_s, runs[1].finishes_s, strict=True):
        assert a == b
    assert (runs[0].configs == runs[1].configs).all()


@pytest.mark.parametrize(
    ("pod_model", "gain", "served_in_time"),
    [(PodModel(), 30, 0.9), (PodModel(2), 50, 0.9), (PodModel(2, RAG_SIM_STAGES), 10, 0.4)],
)
def test_admission_keeps_an_overloaded_queue_short_and_counts_its_drops_as_misses(
    pod_model: PodModel, gain: float, served_in_time: float
) -> None:
    """Static slow under a spike it cannot serve: without admission the queue grows and most
    requests miss; with it, the requests predicted late are dropped and the rest make it. (A
    batching pod serves slower than its profile under load, which the prediction does not know:
    it admits too much, and gains less.)"""
    scenario = spike()
    controller = StaticController("slow", 1)
    servers = pod_model.servers
    plain = simulate(controller, FRONT, scenario, 1000, pod_model=pod_model)
    # Slow alone: no faster member to degrade to, so the requests predicted late are dropped.
    alone = StaticController("slow", 0)
    rule = Admission(slo_ms=1000)
    admitted = simulate(alone, [SLOW], scenario, 1000, pod_model=pod_model, admission=rule)
    assert admitted.compliance > plain.compliance + gain
    assert 5 < admitted.dropped_pct < 100 - admitted.compliance + 1e-9
    served = ~admitted.dropped
    # Those served mostly made it; a dropped request is a miss, with no configuration.
    assert np.mean(admitted.latencies_ms[served] <= 1000) > served_in_time
    assert (admitted.configs[admitted.dropped] == -1).all()
    assert admitted.compliance == pytest.approx(
        100 * np.mean((admitted.latencies_ms <= 1000) & served)
    )
    assert admitted.mean_accuracy == pytest.approx(SLOW.accuracy)
    # The queue the policy saw never grew past what fits in the SLO.
    assert max(t.queue_depth for t in admitted.ticks) <= 1000 / SLOW.mean_ms * servers + 1
    assert max(t.queue_depth for t in plain.ticks) > 20


def test_degrading_serves_on_the_fastest_what_would_be_late_on_the_routed_member() -> None:
    scenario = spike()
    controller = StaticController("slow", 1)
    # Slow alone has no faster member: what would be late is dropped.
    alone = StaticController("slow", 0)
    dropping = simulate(alone, [SLOW], scenario, 1000, admission=Admission(1000))
    degrading = simulate(controller, FRONT, scenario, 1000, admission=Admission(1000))
    assert degrading.dropped_pct < dropping.dropped_pct
    assert degrading.compliance > dropping.compliance
    on_fastest = degrading.configs == 0
    # The fastest serves where the queue is long: in the spike (the middle third), most of all.
    in_spike = (degrading.arrivals_s >= 80) & (degrading.arrivals_s < 160)
    assert on_fastest[in_spike].mean() > 3 * on_fastest[~in_spike].mean() > 0


def test_no_request_is_dropped_at_a_load_the_configuration_keeps_up_with() -> None:
    scenario = make_scenario(make_pattern("constant", 1.0, 300), 5)
    run = simulate(StaticController("slow", 1), FRONT, scenario, 1000, admission=Admission(1000))
    assert run.dropped_pct < 0.5
    assert run.compliance > 99


def test_a_measured_capacity_curve_makes_a_batching_pods_prediction_hold() -> None:
    """A batching pod holds each request longer than its profile when busy. With the capacity
    curve measured at the pod's instances (the simulator playing the hardware), the prediction
    knows it: fewer admitted requests end late, and more requests meet the SLO."""
    pod_model = PodModel(2, RAG_SIM_STAGES)
    curve = measure_capacity(SLOW, pod_model, requests=300)
    assert curve.saturated
    measured = dataclasses.replace(SLOW, capacity=curve)
    assert ServiceGrid([(measured, 1.0)], servers=2).load_factor > 1.2
    # A curve measured at another instance count says nothing about this pod.
    assert ServiceGrid([(measured, 1.0)], servers=4).load_factor == 1.0
    scenario = spike()
    # Slow alone (nothing to degrade to): admission only drops.
    rule = Admission(slo_ms=1000)
    runs = [
        simulate(
            StaticController("slow", 0), [slow], scenario, 1000, pod_model=pod_model, admission=rule
        )
        for slow in (SLOW, measured)
    ]
    late = [np.mean(r.latencies_ms[~r.dropped] > 1000) for r in runs]
    assert late[1] < late[0] / 2
    assert runs[1].compliance > runs[0].compliance + 10


def test_at_dispatch_the_real_wait_decides() -> None:
    rule = Admission(1000, at=AdmissionPoint.DISPATCH, degrade_after=1.0)
    assert judge_at_dispatch(rule, 500, routed_ms=300, fastest_ms=100) is AdmissionVerdict.SERVE
    assert judge_at_dispatch(rule, 200, routed_ms=300, fastest_ms=100) is AdmissionVerdict.FASTEST
    assert judge_at_dispatch(rule, 50, routed_ms=300, fastest_ms=100) is AdmissionVerdict.DROP
    serving = dataclasses.replace(rule, refuse=False)
    assert judge_at_dispatch(serving, 50, routed_ms=300, fastest_ms=100) is AdmissionVerdict.FASTEST
    assert (
        judge_at_dispatch(serving, 200, routed_ms=300, fastest_ms=100) is AdmissionVerdict.FASTEST
    )


def test_at_dispatch_a_long_wait_is_served_on_the_fastest() -> None:
    """Past degrade_after of the SLO waited (a queue behind it), the fastest serves even a
    request its routed member would bring in time; where only the routed one fits, it does."""
    rule = Admission(1000, at=AdmissionPoint.DISPATCH, degrade_after=0.25)
    assert judge_at_dispatch(rule, 800, routed_ms=300, fastest_ms=100) is AdmissionVerdict.SERVE
    assert judge_at_dispatch(rule, 700, routed_ms=300, fastest_ms=100) is AdmissionVerdict.FASTEST
    assert judge_at_dispatch(rule, 700, routed_ms=300, fastest_ms=750) is AdmissionVerdict.SERVE
    assert judge_at_dispatch(rule, 50, routed_ms=300, fastest_ms=100) is AdmissionVerdict.DROP
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(AdmissionError, match="degradeAfter"):
            Admission(1000, degrade_after=bad)


@pytest.mark.parametrize("pod_model", [PodModel(), PodModel(2, RAG_SIM_STAGES)])
def test_admission_at_dispatch_serves_in_time_what_it_serves(pod_model: PodModel) -> None:
    """Static slow under a spike, judged when each request starts: a request is dropped only
    when even the fastest could not make it, the rest are served by the fastest where the
    slow one would be late, and compliance rises far above serving everything."""
    scenario = spike()
    controller = StaticController("slow", 1)
    plain = simulate(controller, FRONT, scenario, 1000, pod_model=pod_model)
    rule = Admission(1000, at=AdmissionPoint.DISPATCH, degrade_after=1.0)
    run = simulate(controller, FRONT, scenario, 1000, pod_model=pod_model, admission=rule)
    assert run.compliance > plain.compliance + 10
    waited_ms = (run.starts_s - run.arrivals_s) * 1000
    own = service_quantiles_ms(FRONT, 0.5)
    dropped, on_fast, on_slow = run.dropped, run.configs == 0, run.configs == 1
    assert dropped.any()
    assert on_fast.any()
    # Dropped at the moment it would start, taking no service: only when even fast was late.
    assert (waited_ms[dropped] > 1000 - own[0]).all()
    assert (run.finishes_s[dropped] == run.starts_s[dropped]).all()
    assert (waited_ms[on_fast] > 1000 - own[1]).all()
    assert (waited_ms[on_slow] <= 1000 - own[1]).all()
    # Degrading after a quarter of the SLO waited: the slow member serves only short waits,
    # and the queue it leaves is shorter (fewer dropped).
    early = dataclasses.replace(rule, degrade_after=0.25)
    quick = simulate(controller, FRONT, scenario, 1000, pod_model=pod_model, admission=early)
    quick_waited_ms = (quick.starts_s - quick.arrivals_s) * 1000
    assert (quick_waited_ms[quick.configs == 1] <= 250).all()
    assert quick.dropped.sum() < run.dropped.sum()
    # Refusing nothing: what would have been dropped is served on the fastest, late, and
    # every other request is judged as before until then.
    serving = dataclasses.replace(rule, refuse=False)
    kept = simulate(controller, FRONT, scenario, 1000, pod_model=pod_model, admission=serving)
    assert not kept.dropped.any()
    first = int(np.argmax(dropped))
    assert kept.configs[first] == 0
    assert (kept.configs[:first] == run.configs[:first]).all()
    assert kept.compliance < run.compliance
    assert kept.compliance > plain.compliance


def test_the_router_gets_each_members_quantile_by_key() -> None:
    table = router_admission(FRONT, Admission(1000, 0.5, degrade_after=0.25))
    assert table["fastest"] == FAST.key
    assert table["degrade_below_ms"] == pytest.approx(750)
    assert table["refuse"] is True
    assert router_admission(FRONT, Admission(1000, refuse=False))["refuse"] is False
    assert table["quantiles_ms"][SLOW.key] == pytest.approx(300, rel=0.01)
    assert table["slo_ms"] == pytest.approx(1000)
    with pytest.raises(AdmissionError, match="front: empty"):
        router_admission([], Admission(1000))
