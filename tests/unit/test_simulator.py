"""The serving simulator: load shapes, paired scenarios, FIFO service, M/G/1 agreement, reports."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass

import numpy as np
import pytest

from compass.domain.arrivals import (
    BURST_FACTORS,
    BURST_SECONDS,
    RAMP_FACTOR,
    SPIKE_FACTOR,
    STEP_FACTOR,
    PatternKind,
    Scenario,
    SimulationError,
    make_pattern,
    make_scenario,
    trace_pattern,
)
from compass.domain.boundpod import BindingRule
from compass.domain.capacity import CapacityCurve, CurvePoint
from compass.domain.elastico import Elastico, ElasticoSettings, capacity_pressure
from compass.domain.mix import Dealing
from compass.domain.planner import (
    Slo,
    ThresholdModel,
    _service_grid,
    _violation,
    plan_thresholds,
)
from compass.domain.podmodel import RAG_SIM_STAGES, PodModel
from compass.domain.policy import Action, Decision, Observation, PolicyState
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import (
    MetricsView,
    QueueAggregate,
    RunReport,
    StaticController,
    aggregate_queue,
    compare,
    simulate,
)
from compass_dev.scenarios import normal_profile as profile

FRONT = [
    profile("fast", 0.70, 100, 15),
    profile("mid", 0.80, 150, 20),
    profile("slow", 0.9, 250, 30),
]


def waits_ms(report: RunReport) -> np.ndarray:
    """Each request's wait before its service started, ms."""
    return (report.starts_s - report.arrivals_s) * 1000


# ---------------------------------------------------------------------------- patterns


def test_pattern_rate_shapes() -> None:
    """Constant, step at half, linear ramp, spike in the middle third; zero outside the run."""
    t = np.array([0.0, 29.9, 30.0, 45.0, 59.9, 60.0, 75.0, 89.9, 90.0])
    base, d = 2.0, 90.0
    constant = make_pattern("constant", base, d).rate(t)
    assert constant.tolist() == [2.0] * 8 + [0.0]
    step = make_pattern("step", base, d).rate(t)
    assert step.tolist() == [2.0, 2.0, 2.0, 2.0 * STEP_FACTOR, 2.0 * STEP_FACTOR] + [
        2.0 * STEP_FACTOR
    ] * 3 + [0.0]
    ramp = make_pattern("ramp", base, d).rate(t)
    assert ramp[:-1] == pytest.approx(base * (1 + (RAMP_FACTOR - 1) * t[:-1] / d))
    spike = make_pattern("spike", base, d).rate(t)
    high = base * SPIKE_FACTOR
    assert spike.tolist() == [2.0, 2.0, high, high, high, 2.0, 2.0, 2.0, 0.0]


def test_bursty_bursts_follow_the_seed_and_their_bounds() -> None:
    """Bursts are 2-5x, 5-15 s long, inside the run, apart; the same seed draws the same ones."""
    pattern = make_pattern("bursty", 1.5, 600, seed=4)
    assert pattern.bursts == make_pattern("bursty", 1.5, 600, seed=4).bursts
    assert pattern.bursts != make_pattern("bursty", 1.5, 600, seed=5).bursts
    assert len(pattern.bursts) >= 10
    for burst, after in zip(pattern.bursts, pattern.bursts[1:], strict=False):
        assert after.start_s > burst.end_s
    for burst in pattern.bursts:
        assert BURST_FACTORS[0] <= burst.factor <= BURST_FACTORS[1]
        assert 0 <= burst.start_s < burst.end_s <= 600
        if burst.end_s < 600:
            assert BURST_SECONDS[0] <= burst.end_s - burst.start_s <= BURST_SECONDS[1]
        middle = np.array([(burst.start_s + burst.end_s) / 2])
        assert pattern.rate(middle)[0] == pytest.approx(1.5 * burst.factor)


def test_arrivals_follow_the_rate() -> None:
    """Spike arrivals: the middle third holds about 4x each outer third's count."""
    counts = np.zeros(3)
    for seed in range(20):
        arrivals = make_scenario(make_pattern("spike", 2.0, 300), seed).arrivals_s
        counts += np.histogram(arrivals, bins=[0, 100, 200, 300])[0]
    expected = np.array([200, 800, 200]) * 20
    assert counts == pytest.approx(expected, rel=0.05)


def test_trace_replays_its_timestamps() -> None:
    """A trace's arrivals are its timestamps shifted to start at 0; bad traces are refused."""
    pattern = trace_pattern([10.0, 10.5, 12.0, 19.0])
    scenario = make_scenario(pattern, 0)
    assert scenario.arrivals_s.tolist() == [0.0, 0.5, 2.0, 9.0]
    assert pattern.kind is PatternKind.TRACE
    assert pattern.rate(np.array([0.2]))[0] == 2.0  # two arrivals in the first second
    with pytest.raises(SimulationError, match="before the one above it"):
        trace_pattern([1.0, 3.0, 2.0])
    with pytest.raises(SimulationError, match="no timestamps"):
        trace_pattern([])


@pytest.mark.parametrize(("base", "duration"), [(0.0, 10.0), (1.0, -5.0)])
def test_bad_load_settings_are_refused(base: float, duration: float) -> None:
    """A non-positive rate or duration is a SimulationError naming the setting."""
    with pytest.raises(SimulationError, match=r"^(base_qps|duration): "):
        make_pattern("spike", base, duration)


# ---------------------------------------------------------------------------- serving


def test_every_policy_serves_the_same_arrivals_and_luck() -> None:
    """compare() is paired: identical arrivals; a request's service time depends only on its
    luck and the configuration that served it."""
    plan = plan_thresholds(FRONT, Slo(1000))
    scenario = make_scenario(make_pattern("bursty", 2.0, 120, seed=1), 1)
    reports = compare({"policy": Elastico(plan)}, FRONT, scenario, 1000)
    assert set(reports) == {"fastest", "middle", "accurate", "policy"}
    service = {label: r.finishes_s - r.starts_s for label, r in reports.items()}
    for label, report in reports.items():
        assert np.array_equal(report.arrivals_s, scenario.arrivals_s)
        expected = np.stack([p.distribution.quantile(scenario.luck) / 1000 for p in FRONT])[
            report.configs, np.arange(report.requests)
        ]
        assert service[label] == pytest.approx(expected)
    # The same seed gives the same scenario; another seed another one.
    again = make_scenario(make_pattern("bursty", 2.0, 120, seed=1), 1)
    assert np.array_equal(again.arrivals_s, scenario.arrivals_s)
    assert np.array_equal(again.luck, scenario.luck)
    other = make_scenario(make_pattern("bursty", 2.0, 120, seed=1), 2)
    assert not np.array_equal(other.arrivals_s[:10], scenario.arrivals_s[:10])


def test_fifo_single_server() -> None:
    """Starts never precede arrivals nor the previous finish; service times are positive."""
    scenario = make_scenario(make_pattern("spike", 3.0, 120), 3)
    report = simulate(StaticController("mid", 1), FRONT, scenario, 1000)
    assert np.all(report.starts_s >= report.arrivals_s)
    assert np.all(report.starts_s[1:] >= report.finishes_s[:-1] - 1e-12)
    assert np.all(report.finishes_s > report.starts_s)
    assert np.all(report.configs == 1)


@dataclass(frozen=True)
class Alternate:
    """Switches between fast and slow every 7 s."""

    def initial_state(self, now: float) -> PolicyState:
        return PolicyState(active="fast")

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        index = 2 if int(now // 7) % 2 else 0
        name = FRONT[index].name
        action = Action.HOLD if name == state.active else Action.FASTER
        return Decision(name, index, action, "test"), PolicyState(active=name)


def test_a_request_keeps_the_configuration_active_when_it_starts() -> None:
    """Each request is served by the configuration active at its start, not at its arrival."""
    scenario = make_scenario(make_pattern("constant", 6.0, 120), 0)
    report = simulate(Alternate(), FRONT, scenario, 1000)
    active_at_start = np.where((np.floor(report.starts_s) // 7) % 2 == 1, 2, 0)
    assert np.array_equal(report.configs, active_at_start)
    waited = report.starts_s - report.arrivals_s
    # Some requests arrived under one configuration and started under the other.
    arrived_under = np.where((np.floor(report.arrivals_s) // 7) % 2 == 1, 2, 0)
    assert np.any((arrived_under != report.configs) & (waited > 0))
    assert report.switches == sum(t.switched for t in report.ticks)
    assert sum(report.time_in_config_s) == pytest.approx(len(report.ticks))


@pytest.mark.parametrize(("rate", "index"), [(3.0, 1), (5.0, 0), (2.5, 2)])
def test_mean_wait_matches_pollaczek_khinchine(rate: float, index: int) -> None:
    """Constant Poisson load on one configuration: mean wait = lambda E[S^2] / (2 (1 - rho))."""
    service = FRONT[index].distribution
    second_moment = (service.mean_ms**2 + service.std_ms**2) / 1e6
    rho = rate * service.mean_ms / 1000
    expected_ms = rate * second_moment / (2 * (1 - rho)) * 1000
    waits = []
    for seed in range(4):
        scenario = make_scenario(make_pattern("constant", rate, 2000), seed)
        waits.append(
            waits_ms(simulate(StaticController(FRONT[index].name, index), FRONT, scenario, 1e9))
        )
    assert np.concatenate(waits).mean() == pytest.approx(expected_ms, rel=0.08)


def test_violations_match_the_planners_mg1_tail() -> None:
    """The simulated share of requests over the SLO matches the Cramer-Lundberg prediction."""
    for index, rate, slo in ((1, 3.5, 600.0), (2, 2.0, 700.0), (1, 4.5, 800.0)):
        missed = []
        for seed in range(3):
            scenario = make_scenario(make_pattern("constant", rate, 3000), seed)
            report = simulate(StaticController(FRONT[index].name, index), FRONT, scenario, slo)
            missed.append(1 - report.compliance / 100)
        predicted = _violation(_service_grid(FRONT[index]), rate, slo / 1000)
        assert 0.02 < predicted < 0.3
        assert np.mean(missed) == pytest.approx(predicted, abs=0.01)


def test_report_figures_are_computed_from_the_requests() -> None:
    """Compliance, mean accuracy and percentiles come from the per-request records."""
    plan = plan_thresholds(FRONT, Slo(600), model=ThresholdModel.TAIL)
    scenario = make_scenario(make_pattern("spike", 1.0, 120), 2)
    report = simulate(Elastico(plan), FRONT, scenario, 600)
    latencies = (report.finishes_s - report.arrivals_s) * 1000
    assert report.compliance == pytest.approx(100 * np.mean(latencies <= 600))
    accuracy = np.array([p.accuracy for p in FRONT])[report.configs].mean()
    assert report.mean_accuracy == pytest.approx(accuracy)
    assert report.latency_percentile(95) == pytest.approx(np.percentile(latencies, 95))
    summary = report.summary()
    assert summary["requests"] == report.requests
    assert summary["switches"] == report.switches
    # The policy used more than one configuration and switched for a reason it recorded.
    assert len(set(report.configs.tolist())) > 1
    assert len(report.reasons) == report.switches


# ---------------------------------------------------------------------------- pods and delays


def test_the_pod_assignment_is_seeded_uniform_and_leaves_the_scenario_alone() -> None:
    scenario = make_scenario(make_pattern("constant", 20.0, 120), 5)
    again = make_scenario(make_pattern("constant", 20.0, 120), 5)
    assert np.array_equal(scenario.pods_of(3), again.pods_of(3))
    counts = np.bincount(scenario.pods_of(3), minlength=3)
    assert counts.sum() == scenario.requests
    assert np.all(np.abs(counts - scenario.requests / 3) < 4 * np.sqrt(scenario.requests / 3))
    assert set(scenario.pods_of(1).tolist()) == {0}
    with pytest.raises(SimulationError, match="pods: 0 is not >= 1"):
        scenario.pods_of(0)


def test_two_pods_split_a_load_one_server_cannot_keep_up_with() -> None:
    """Twice the load one server sustains: one pod's queue grows without bound, two keep up."""
    scenario = make_scenario(make_pattern("constant", 12.0, 60), 2)  # fast: 10/s each
    one = simulate(StaticController("fast", 0), FRONT, scenario, 1000)
    two = simulate(StaticController("fast", 0), FRONT, scenario, 1000, pods=2)
    assert waits_ms(one).mean() > 10 * waits_ms(two).mean()
    assigned = scenario.pods_of(2)
    for pod in range(2):
        mine = assigned == pod
        starts, finishes = two.starts_s[mine], two.finishes_s[mine]
        assert np.all(starts[1:] >= finishes[:-1] - 1e-12)  # FIFO on each pod
    # The two pods overlap in time: the load really was served in parallel.
    first = two.finishes_s[assigned == 0]
    second = two.starts_s[assigned == 1]
    assert np.any((second[:, None] < first[None, :]) & (second[:, None] > first[None, :] - 0.1))


@dataclass
class Recorder:
    """Holds `fast` and records the observations it was given."""

    seen: list[Observation]

    def initial_state(self, now: float) -> PolicyState:
        return PolicyState(active="fast")

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        assert observation is not None
        self.seen.append(observation)
        return Decision("fast", 0, Action.HOLD, "test"), state


@pytest.mark.parametrize("aggregate", list(QueueAggregate))
def test_the_policy_sees_the_per_pod_queue_and_arrivals(aggregate: QueueAggregate) -> None:
    scenario = make_scenario(make_pattern("constant", 18.0, 30), 4)
    recorder = Recorder([])
    report = simulate(recorder, FRONT, scenario, 1000, pods=3, queue_aggregate=aggregate)
    assigned = scenario.pods_of(3)
    for observation in recorder.seen[1:]:
        now = observation.time
        arrived = scenario.arrivals_s <= now
        waiting = [
            int(np.sum(arrived & (assigned == pod) & (report.starts_s > now))) for pod in range(3)
        ]
        assert observation.pods == 3
        assert observation.queue_depth == pytest.approx(aggregate_queue(waiting, aggregate))
        assert observation.arrivals_total == pytest.approx(arrived.sum() / 3)
    assert aggregate_queue([0, 2, 7], QueueAggregate.MEAN) == 3
    assert aggregate_queue([0, 2, 7], QueueAggregate.MAX) == 7


def test_a_scraped_view_shows_the_pods_at_the_last_scrape_late_by_its_lag() -> None:
    """Scraped every 2 s, each sample 0.5 s late: the tick at t reads the scrape taken at
    2 * floor(t / 2), stamped then, holding the pods and the counter as they were 0.5 s
    before it (never before 0)."""
    scenario = make_scenario(make_pattern("constant", 18.0, 30), 4)
    recorder = Recorder([])
    view = MetricsView(scrape_interval_s=2.0, lag_s=0.5)
    report = simulate(recorder, FRONT, scenario, 1000, pods=3, metrics_view=view)
    assigned = scenario.pods_of(3)
    delayed = 0
    for tick, observation in enumerate(recorder.seen):
        taken = 2.0 * (tick // 2)
        seen = max(taken - 0.5, 0.0)
        arrived = scenario.arrivals_s <= seen
        waiting = [
            int(np.sum(arrived & (assigned == pod) & (report.starts_s > seen))) for pod in range(3)
        ]
        assert observation.time == taken
        assert observation.queue_depth == pytest.approx(
            aggregate_queue(waiting, QueueAggregate.MEAN)
        )
        assert observation.arrivals_total == pytest.approx(arrived.sum() / 3)
        now_arrived = np.sum(scenario.arrivals_s <= tick)
        delayed += now_arrived > arrived.sum()
    assert delayed > len(recorder.seen) / 2  # at 18/s the view really is behind


def test_the_default_view_and_a_scrape_every_tick_are_the_fresh_read() -> None:
    """The default reads the pods at the tick; a scrape every tick, without lag, is the same
    read, request for request; a lagged one is not."""
    plan = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)
    scenario = make_scenario(make_pattern("spike", 3.0, 120), seed=2)
    fresh = simulate(Elastico(plan), FRONT, scenario, 1000)
    for view in (MetricsView(), MetricsView(scrape_interval_s=1.0)):
        again = simulate(Elastico(plan), FRONT, scenario, 1000, metrics_view=view)
        assert again.ticks == fresh.ticks
        assert again.reasons == fresh.reasons
        assert np.array_equal(again.configs, fresh.configs)
        assert np.array_equal(again.finishes_s, fresh.finishes_s)
    lagged = simulate(Elastico(plan), FRONT, scenario, 1000, metrics_view=MetricsView(lag_s=3.0))
    assert lagged.ticks != fresh.ticks


def first_step_down(report: RunReport, after_s: float) -> float:
    """When the policy first left the configuration it served at ``after_s``, for a faster one."""
    start = next(t.active for t in report.ticks if t.time_s >= after_s)
    return next(t.time_s for t in report.ticks if t.time_s >= after_s and t.active < start)


def test_a_delayed_view_steps_down_later_in_a_spike_and_misses_more() -> None:
    """A 4x spike past the middle member's capacity: read fresh, the policy steps down to the
    fastest a tick after the spike starts; through a 10 s scrape (staleAfter above it, so the
    readings count) it waits for the next scrape to see the queue, and more requests miss the
    SLO. The baselines look at nothing: the view leaves them alone."""
    plan = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)
    policy = Elastico(plan, ElasticoSettings(stale_after_s=30.0))
    scenario = make_scenario(make_pattern("spike", 1.5, 180), seed=1)
    fresh = compare({"policy": policy}, FRONT, scenario, 1000)
    scraped = compare(
        {"policy": policy}, FRONT, scenario, 1000, metrics_view=MetricsView(scrape_interval_s=10.0)
    )
    spike = 60.0
    early, late = first_step_down(fresh["policy"], spike), first_step_down(scraped["policy"], spike)
    assert early - spike <= 2
    assert late >= early + 5
    assert scraped["policy"].compliance < fresh["policy"].compliance
    for label in ("fastest", "middle", "accurate"):
        assert np.array_equal(scraped[label].finishes_s, fresh[label].finishes_s)


@pytest.mark.parametrize(
    ("scrape", "lag"), [(-1.0, 0.0), (0.0, -0.5), (float("nan"), 0.0), (0.0, float("inf"))]
)
def test_a_negative_or_unbounded_metrics_delay_is_refused(scrape: float, lag: float) -> None:
    with pytest.raises(SimulationError, match=r"^(scrape_interval|lag): "):
        MetricsView(scrape, lag)


def test_a_switch_takes_effect_after_its_delay() -> None:
    """With a 0.4 s delay, requests starting in the first 0.4 s after a decision keep the old
    configuration; with none, every request after the decision gets the new one."""
    scenario = make_scenario(make_pattern("constant", 6.0, 60), 1)
    prompt = simulate(Alternate(), FRONT, scenario, 1000)
    late = simulate(Alternate(), FRONT, scenario, 1000, switch_delay_s=0.4)
    phase = np.floor(late.starts_s) // 7 % 2  # which configuration was decided last
    since = late.starts_s - 7 * (np.floor(late.starts_s) // 7)  # time since that decision
    expected = np.where(phase == 1, 2, 0)
    settled = since > 0.4 + 1e-9
    assert np.array_equal(late.configs[settled], expected[settled])
    early = ~settled & (late.starts_s > 7)
    assert np.any(early)
    assert np.all(late.configs[early] != expected[early])
    assert not np.array_equal(prompt.configs, late.configs)
    with pytest.raises(SimulationError, match="switch_delay"):
        simulate(Alternate(), FRONT, scenario, 1000, switch_delay_s=-1)


def test_capacity_pressure_rises_during_a_spike_the_fastest_cannot_serve() -> None:
    """A 4x spike past the fastest's capacity (12/s against ~10/s): the pressure the operator
    would export is 0 before it, rises past 1 while the fastest's queue builds, and is 0 again
    once the queue has drained after it."""
    plan = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)
    scenario = make_scenario(make_pattern("spike", 3.0, 180), seed=1)
    assert scenario.pattern.peak_qps == 3.0 * SPIKE_FACTOR
    report = simulate(Elastico(plan), FRONT, scenario, 1000)
    # What the operator exports after each decision: one pod, so the depth is a whole count.
    pressure = {
        t.time_s: capacity_pressure(plan, plan.names[t.active], t.queue_depth) for t in report.ticks
    }
    spike_start, spike_end = 60.0, 120.0
    before = [pressure[t.time_s] for t in report.ticks if t.time_s < spike_start]
    during = [t for t in report.ticks if spike_start <= t.time_s < spike_end]
    after = [pressure[t.time_s] for t in report.ticks if t.time_s >= spike_end + 30]
    assert before
    assert after
    assert max(before) == 0.0
    assert max(after) == 0.0
    peak = max(during, key=lambda t: pressure[t.time_s])
    assert pressure[peak.time_s] > 2.0
    assert peak.active == 0  # only ever on the fastest
    assert all(t.active == 0 for t in report.ticks if pressure[t.time_s] > 0)
    # It rises with the queue: the spike's last third presses harder than its first.
    third = len(during) // 3
    first = np.mean([pressure[t.time_s] for t in during[:third]])
    last = np.mean([pressure[t.time_s] for t in during[-third:]])
    assert last > first > 1.0


def contended_member(servers: int, holding_factor: float) -> LatencyProfile:
    """A 100 ms member whose capacity curve at ``servers`` instances drains as if each request
    held its instance ``holding_factor`` times its own time (instances sharing cores)."""
    member = profile("cpu", 0.8, 100, 10)
    drain = servers * 1000 / (holding_factor * member.mean_ms)
    points = (
        CurvePoint(drain / 2, drain / 2, member.mean_ms, ((50.0, member.mean_ms),)),
        CurvePoint(2 * drain, drain, 5000.0, ((50.0, 5000.0),), growing=True),
    )
    return dataclasses.replace(member, capacity=CapacityCurve(servers, points))


def test_a_contended_pod_drains_at_its_curves_rate_and_a_light_load_keeps_its_own_time() -> None:
    member = contended_member(4, holding_factor=2.0)
    heavy = make_scenario(make_pattern("constant", 60.0, 60.0, seed=1), 1)
    light = make_scenario(make_pattern("constant", 1.0, 600.0, seed=1), 1)
    fixed = StaticController("cpu", 0)

    def served(scenario: Scenario, contended: bool) -> RunReport:
        model = PodModel(servers=4, contended=contended)
        return simulate(fixed, [member], scenario, 1000, pod_model=model)

    # 60/s offered; 4 instances at 100 ms would drain 40/s, contended only 20/s.
    free_run, contended_run = served(heavy, False), served(heavy, True)
    drain_s = heavy.requests / 20.0
    assert contended_run.finishes_s.max() == pytest.approx(drain_s, rel=0.1)
    assert free_run.finishes_s.max() < 0.75 * drain_s
    # Rarely two at once at 1/s: about the member's own 100 ms.
    calm = served(light, True).latencies_ms
    assert float(np.median(calm)) == pytest.approx(100.0, rel=0.1)


def test_a_pod_is_contended_or_staged_not_both() -> None:
    with pytest.raises(SimulationError, match="contended"):
        PodModel(servers=4, stages=RAG_SIM_STAGES, contended=True)


# ---------------------------------------------------------------------------- late-last queue


def _late_last(late_after_s: float | None, **pod: object) -> RunReport:
    """Static "mid" on a spike that overloads it, the pod's queue FIFO or late-last."""
    scenario = make_scenario(make_pattern("spike", 4.0, 120), 5)
    model = PodModel(late_after_s=late_after_s, **pod)  # type: ignore[arg-type]
    return simulate(StaticController("mid", 1), FRONT, scenario, 500, pod_model=model)


@pytest.mark.parametrize("pod", [{}, {"servers": 2, "stages": RAG_SIM_STAGES}])
def test_a_late_last_queue_serves_a_late_request_after_every_one_in_time(
    pod: dict[str, object],
) -> None:
    """Whenever a request starts, no request still within ``late_after_s`` of its arrival waited
    longer than it did while it was itself past that; and the order meets the SLO more often
    than FIFO under an overload, serving every request all the same."""
    late_after = 0.35
    fifo, late_last = _late_last(None, **pod), _late_last(late_after, **pod)
    waited = late_last.starts_s - late_last.arrivals_s
    for request in np.flatnonzero(waited > late_after + 1e-9):
        begin = late_last.starts_s[request]
        # Requests waiting when it started (arrived before, started after) were all late too.
        behind = (late_last.arrivals_s < begin) & (late_last.starts_s > begin)
        assert np.all(begin - late_last.arrivals_s[behind] > late_after - 1e-9)
    assert np.any(waited > late_after), "the spike made no request late"
    assert late_last.requests == fifo.requests
    assert np.all(late_last.finishes_s > late_last.starts_s)
    assert late_last.compliance > fifo.compliance + 5
    # Pure FIFO where nothing waits that long.
    assert np.array_equal(_late_last(1e6, **pod).starts_s, fifo.starts_s)


def test_a_negative_late_after_is_refused() -> None:
    with pytest.raises(SimulationError, match="late_after"):
        PodModel(late_after_s=-1.0)


def test_a_simulation_error_crosses_a_process_boundary_whole() -> None:
    """The benches run scenarios in worker processes: the error a worker raises reaches the
    parent with its field, what and fix, not as a TypeError from unpickling it."""
    with pytest.raises(SimulationError) as raised:
        make_pattern("spike", 0, 180)
    copy = pickle.loads(pickle.dumps(raised.value))
    assert isinstance(copy, SimulationError)
    assert (copy.field, copy.what, copy.fix) == (
        raised.value.field,
        raised.value.what,
        raised.value.fix,
    )
    assert str(copy) == str(raised.value)


# ---------------------------------------------------------------------------- the gateway's draw


@dataclass(frozen=True)
class FixedMix:
    """A policy that serves one mix of the front's first two members, and from ``until`` on
    the first alone."""

    weight: float
    until: float = float("inf")

    def initial_state(self, now: float) -> PolicyState:
        """On the mix from the start."""
        return PolicyState(active=FRONT[0].name, blend=FRONT[1].name, weight=self.weight)

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The mix, then the first member alone."""
        if now >= self.until:
            return Decision(FRONT[0].name, 0, Action.FASTER, "done"), state
        return Decision(FRONT[0].name, 0, Action.HOLD, "mix", FRONT[1].name, 1, self.weight), state


def test_the_gateway_draws_each_request_by_weight_across_the_pool_the_same_per_seed() -> None:
    scenario = make_scenario(make_pattern("constant", 4.0, 600.0), 11)
    drawn = simulate(FixedMix(0.3), FRONT, scenario, 1000.0, pods=3, dealing=Dealing.DRAW)
    dealt = simulate(FixedMix(0.3), FRONT, scenario, 1000.0, pods=3)
    n = drawn.requests
    share = float(np.mean(drawn.configs == 1))
    assert abs(share - 0.3) <= 4 * (0.3 * 0.7 / n) ** 0.5
    # Round-robin holds every 20 requests of a pod to the mix; the draw only on average, so
    # some run of 20 drawn requests strays from 6 blends where no dealt one does.
    windows = np.lib.stride_tricks.sliding_window_view(drawn.configs == 1, 20).sum(axis=1)
    assert windows.min() < 6 < windows.max()
    assert not np.array_equal(drawn.configs, dealt.configs)
    again = simulate(FixedMix(0.3), FRONT, scenario, 1000.0, pods=3, dealing=Dealing.DRAW)
    assert np.array_equal(drawn.configs, again.configs)
    assert np.array_equal(drawn.finishes_s, again.finishes_s)


def test_the_gateway_fixes_a_requests_member_at_arrival_the_routers_at_take_up() -> None:
    # Overloaded on the blend: a queue builds, then the policy switches to the fastest alone.
    scenario = make_scenario(make_pattern("constant", 9.0, 60.0), 2)
    policy = FixedMix(1.0, until=30.0)
    drawn = simulate(policy, FRONT, scenario, 1000.0, dealing=Dealing.DRAW)
    dealt = simulate(policy, FRONT, scenario, 1000.0)
    # Arrived under the blend, started after the switch: the gateway had already rewritten
    # their model to the blend's; a router binds them to the member in force at take-up.
    queued = (scenario.arrivals_s < 30.0) & (drawn.starts_s > 30.5)
    assert queued.sum() > 5
    assert set(drawn.configs[queued].tolist()) == {1}
    late = (scenario.arrivals_s < 30.0) & (dealt.starts_s > 30.5)
    assert late.sum() > 5
    assert set(dealt.configs[late].tolist()) == {0}


def test_a_binding_rule_has_no_mix_for_the_gateway_to_draw() -> None:
    scenario = make_scenario(make_pattern("constant", 2.0, 10.0), 0)
    with pytest.raises(SimulationError, match="dealing"):
        simulate(BindingRule(), FRONT, scenario, 1000.0, dealing=Dealing.DRAW)
