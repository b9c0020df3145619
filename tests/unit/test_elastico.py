"""Elastico's decide(observation, state, now) under a fake clock: hysteresis, steps, metrics loss."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from compass.domain.elastico import (
    Elastico,
    ElasticoSettings,
    MetricsLoss,
    capacity_pressure,
    rate_lower_bound,
    rate_upper_bound,
)
from compass.domain.planner import Plan, Slo, ThresholdModel, plan_thresholds
from compass.domain.policy import Action, Decision, Observation, PolicyState
from compass_dev.scenarios import normal_profile as profile

FAST = profile("fast", 0.70, 100, 15)
MID = profile("mid", 0.80, 150, 20)
SLOW = profile("slow", 0.90, 250, 30)


def make_plan(model: ThresholdModel = ThresholdModel.TAIL, slo_ms: float = 1000) -> Plan:
    return plan_thresholds([FAST, MID, SLOW], Slo(slo_ms), 50, model)


PLAN = make_plan()
ROUND = {"fast": 0, "mid": 1, "slow": 2}


def on(name: str, now: float = 0.0) -> PolicyState:
    return PolicyState(active=name, active_since=now)


Step = tuple[float, Decision, PolicyState]


def run(
    policy: Elastico,
    state: PolicyState,
    seconds: int,
    observe: Callable[[float], Observation | None],
    start: float = 0.0,
) -> list[Step]:
    """Decide once a second with a fake clock; every decision and the state after it."""
    steps = []
    for tick in range(seconds):
        now = start + tick
        decision, state = policy.decide(observe(now), state, now)
        steps.append((now, decision, state))
    return steps


def queue(depth: float) -> Callable[[float], Observation]:
    return lambda now: Observation(time=now, queue_depth=depth)


def switches(steps: list[Step]) -> list[tuple[float, Decision]]:
    return [(now, decision) for now, decision, _ in steps if decision.switched]


# ---------------------------------------------------------------------------- hysteresis


def test_upscale_at_once_downscale_only_after_the_whole_cooldown() -> None:
    """Over the stay limit: faster in the same decision. Calm: more accurate only after 5 s."""
    policy = Elastico(PLAN, ElasticoSettings(cooldown_exponent=0))
    over = PLAN.thresholds[1].stay_max_queue
    assert over is not None
    decision, state = policy.decide(Observation(0.0, over + 1), on("mid"), 0.0)
    assert decision.action is Action.FASTER
    assert decision.target == "fast"
    # Now calm: the entry condition of "mid" holds from t = 1 on; it must hold 5 s.
    steps = run(policy, state, 10, queue(0), start=1.0)
    moved = switches(steps)
    assert moved[0][0] == 6.0  # held at 1, 2, 3, 4, 5 and 6: 5 s
    assert all(d.action is Action.HOLD for t, d, _ in steps if t < 6.0)


def test_one_bad_observation_restarts_the_downscale_clock() -> None:
    """A queue over the entry limit at t = 3 restarts the count: the switch moves to t = 8."""
    policy = Elastico(PLAN, ElasticoSettings(cooldown_exponent=0))
    enter = PLAN.thresholds[1].enter_max_queue
    assert enter is not None

    def observe(now: float) -> Observation:
        return Observation(now, enter + 1 if now == 3.0 else 0)

    steps = run(policy, on("fast"), 12, observe)
    assert switches(steps)[0][0] == 9.0  # condition back at t = 4, held through t = 9


@pytest.mark.parametrize("seed", range(5))
def test_no_oscillation_on_a_threshold(seed: int) -> None:
    """A queue that sits on mid's limit for 30 minutes: switches stay bounded by the cooldowns.

    Each step to a more accurate configuration needs its whole cooldown of calm since the last
    switch, and every step faster undoes at most one such step, so over T seconds there are at
    most 2 * T / (shortest cooldown) + 1 switches, and none of them within a cooldown.
    """
    policy = Elastico(PLAN)
    stay = PLAN.thresholds[1].stay_max_queue
    assert stay is not None
    rng = np.random.default_rng(seed)
    depths = rng.integers(stay - 1, stay + 2, size=1800)  # limit - 1, limit, limit + 1
    steps = run(policy, on("mid"), 1800, lambda now: Observation(now, float(depths[int(now)])))
    moved = switches(steps)
    shortest = min(policy.cooldown_s(i) for i in PLAN.eligible[1:])
    assert len(moved) <= 2 * 1800 / shortest + 1
    per_minute = len(moved) / 30
    assert per_minute <= 60 / shortest * 2
    previous = 0.0
    for now, decision in moved:
        if decision.action is Action.MORE_ACCURATE:
            assert now - previous >= policy.cooldown_s(decision.index) - 1e-9
        previous = now


def test_alternating_queue_never_flaps() -> None:
    """Over the limit every other second: one switch to faster, then nothing, for 10 minutes."""
    policy = Elastico(PLAN)
    stay = PLAN.thresholds[2].stay_max_queue
    assert stay is not None
    steps = run(policy, on("slow"), 600, lambda now: Observation(now, stay + (now % 2)))
    moved = switches(steps)
    assert [d.action for _, d in moved] == [Action.FASTER]


def test_upscale_jumps_several_steps_in_one_decision() -> None:
    """A queue only the fastest can take: slow -> fast directly, not through mid."""
    policy = Elastico(PLAN)
    mid_limit = PLAN.thresholds[1].stay_max_queue
    assert mid_limit is not None
    decision, _ = policy.decide(Observation(0.0, mid_limit + 1), on("slow"), 0.0)
    assert (decision.action, decision.target) == (Action.FASTER, "fast")
    # A queue mid can take: one step is enough.
    decision, _ = policy.decide(Observation(0.0, mid_limit), on("slow"), 0.0)
    assert (decision.action, decision.target) == (Action.FASTER, "mid")


def test_downscale_climbs_several_proven_steps_with_growing_cooldowns() -> None:
    """Calm: mid after its cooldown, slow after its own (longer) one, each step proven.

    With equal cooldowns both steps are proven at the same moment, so one decision takes both.
    """
    growing = Elastico(PLAN, ElasticoSettings(cooldown_exponent=2))
    cooldowns = [growing.cooldown_s(i) for i in range(3)]
    assert cooldowns[1] == pytest.approx(5 * 1.5**2)
    assert cooldowns[2] == pytest.approx(5 * 2.5**2)
    moved = switches(run(growing, on("fast"), 60, queue(0)))
    assert [(now, d.target) for now, d in moved] == [
        (np.ceil(cooldowns[1]), "mid"),
        # The clock for slow starts at the first observation after the switch to mid.
        (np.ceil(cooldowns[1]) + 1 + np.ceil(cooldowns[2]), "slow"),
    ]
    flat = Elastico(PLAN, ElasticoSettings(cooldown_exponent=0))
    moved = switches(run(flat, on("fast"), 10, queue(0)))
    assert [(now, d.target, d.action) for now, d in moved] == [(5.0, "slow", Action.MORE_ACCURATE)]


def test_upscale_cooldown_delays_a_second_upscale() -> None:
    """With an upscale cooldown of 3 s, a second step faster waits for it."""
    policy = Elastico(PLAN, ElasticoSettings(upscale_cooldown_s=3))
    slow_limit = PLAN.thresholds[2].stay_max_queue
    mid_limit = PLAN.thresholds[1].stay_max_queue
    assert slow_limit is not None
    assert mid_limit is not None
    first, state = policy.decide(Observation(0.0, slow_limit + 1), on("slow"), 0.0)
    assert first.target == "mid"
    held, state = policy.decide(Observation(1.0, mid_limit + 1), state, 1.0)
    assert held.action is Action.HOLD
    assert "upscale cooldown" in held.reason
    later, _ = policy.decide(Observation(3.0, mid_limit + 1), state, 3.0)
    assert later.target == "fast"


# ---------------------------------------------------------------------------- metrics


def test_missing_or_stale_metrics_hold_when_asked() -> None:
    """on_metrics_loss = hold: no observation, or one older than staleAfter, holds, and the
    downscale clock restarts."""
    policy = Elastico(
        PLAN,
        ElasticoSettings(cooldown_exponent=0, stale_after_s=5, on_metrics_loss=MetricsLoss.HOLD),
    )
    steps = run(policy, on("fast"), 3, queue(0))
    state = steps[-1][2]
    assert state.downscale_since is not None
    decision, state = policy.decide(None, state, 3.0)
    assert decision.action is Action.HOLD
    assert "missing" in decision.reason
    assert state.downscale_since is None
    decision, _ = policy.decide(Observation(time=0.0, queue_depth=0), state, 5.5)
    assert decision.action is Action.HOLD
    assert "stale" in decision.reason
    fresh, _ = policy.decide(Observation(time=0.5, queue_depth=0), state, 5.5)
    assert "stale" not in fresh.reason
    on_slow, _ = policy.decide(None, replace(state, active="slow"), 60.0)
    assert on_slow.action is Action.HOLD


def test_by_default_metrics_lost_for_stale_after_fall_back_to_the_fastest() -> None:
    """A failed read or two is a blip: hold. Once the newest sample is older than staleAfter,
    the fastest: blind on the most accurate, a spike's queue would break the SLO unseen."""
    policy = Elastico(PLAN, ElasticoSettings(stale_after_s=5))
    assert policy.settings.on_metrics_loss is MetricsLoss.FASTEST
    state = on("slow")
    for now in (0.0, 1.0, 2.0):
        _, state = policy.decide(Observation(now, 0), state, now)
    assert state.observed_at == 2.0
    for now in (3.0, 5.0, 7.0):
        blip, state = policy.decide(None, state, now)
        assert (blip.action, blip.target) == (Action.HOLD, "slow"), blip
    lost, state = policy.decide(None, state, 7.5)
    assert (lost.action, lost.target) == (Action.FALLBACK, "fast")
    assert "metrics missing: fastest" in lost.reason


def test_a_series_that_stopped_moving_is_stale_by_its_own_timestamp() -> None:
    """Prometheus keeps answering with the last sample of a frozen series: its timestamp, not
    the time of the read, says how old it is."""
    policy = Elastico(PLAN, ElasticoSettings(stale_after_s=5))
    state = on("slow")
    steps = run(policy, state, 12, lambda now: Observation(time=min(now, 2.0), queue_depth=0))
    held = [d for now, d, _ in steps if now <= 7]
    assert all(d.action is Action.HOLD for d in held)
    fallback = [(now, d) for now, d, _ in steps if d.action is Action.FALLBACK]
    assert [now for now, _ in fallback] == [8.0]
    assert "stale (6.0 s)" in fallback[0][1].reason


def test_missing_metrics_fall_back_to_the_fastest_whatever_the_cooldowns() -> None:
    """on_metrics_loss = fastest: to the fastest once lost, whatever the cooldowns; before
    the first observation the grace runs from the active configuration's start."""
    policy = Elastico(
        PLAN, ElasticoSettings(on_metrics_loss=MetricsLoss.FASTEST, upscale_cooldown_s=60)
    )
    started, state = policy.decide(None, on("slow", 0.0), 1.0)
    assert (started.action, started.target) == (Action.HOLD, "slow")
    decision, state = policy.decide(None, state, 5.5)
    assert (decision.action, decision.target) == (Action.FALLBACK, "fast")
    again, _ = policy.decide(None, state, 6.5)
    assert again.action is Action.HOLD
    unknown_start, _ = policy.decide(None, PolicyState(active="slow"), 1.0)
    assert unknown_start.action is Action.FALLBACK


def test_paused_and_unknown_active() -> None:
    """Paused holds even under a huge queue; an active name not on the front restarts fastest."""
    paused = Elastico(PLAN, ElasticoSettings(paused=True))
    decision, _ = paused.decide(Observation(0.0, 1000), on("slow"), 0.0)
    assert decision.action is Action.HOLD
    policy = Elastico(PLAN)
    decision, state = policy.decide(Observation(0.0, 0), on("gone"), 0.0)
    assert (decision.action, decision.target) == (Action.FALLBACK, "fast")
    assert state.active == "fast"
    decision, _ = policy.decide(Observation(0.0, 0), PolicyState(), 0.0)
    assert decision.target == "fast"


# ---------------------------------------------------------------------------- arrivals


def poisson_counter(rate: Callable[[float], float], seed: int) -> Callable[[float], Observation]:
    """Observations of an empty queue with a Poisson arrivals counter at this rate."""
    rng = np.random.default_rng(seed)
    totals: dict[float, float] = {}

    def observe(now: float) -> Observation:
        previous = totals.get(now - 1, 0.0)
        totals[now] = previous + (float(rng.poisson(rate(now))) if now > 0 else 0.0)
        return Observation(time=now, queue_depth=0, arrivals_total=totals[now])

    return observe


def test_a_burst_moves_faster_before_the_queue_shows_it() -> None:
    """10 requests/s against slow's limit of ~2.4/s: faster within 2 s, with an empty queue."""
    policy = Elastico(PLAN)
    observe = poisson_counter(lambda now: 1.0 if now < 30 else 10.0, seed=3)
    steps = run(policy, on("slow"), 40, observe)
    first = switches(steps)[0]
    assert 30 <= first[0] <= 32
    assert first[1].action is Action.FASTER
    assert "arrivals >=" in first[1].reason


@pytest.mark.parametrize("seed", range(3))
def test_steady_arrivals_below_a_limit_do_not_switch(seed: int) -> None:
    """1.5 requests/s for 20 minutes on mid (limit ~5/s): Poisson noise never forces a switch."""
    policy = Elastico(PLAN)
    limit = PLAN.thresholds[1].stay_max_qps
    assert limit is not None
    assert limit > 3 * 1.5
    steps = run(policy, on("mid"), 1200, poisson_counter(lambda now: 1.5, seed))
    assert not [d for _, d in switches(steps) if d.action is Action.FASTER]


def test_rate_limits_keep_a_slow_configuration_out_under_load() -> None:
    """4 requests/s with an empty queue: the queue alone would allow slow; the rate does not."""
    policy = Elastico(PLAN, ElasticoSettings(cooldown_exponent=0))
    steps = run(policy, on("fast"), 120, poisson_counter(lambda now: 4.0, seed=1))
    assert {state.active for _, _, state in steps} <= {"fast", "mid"}
    # The paper's model sees only the queue: it climbs to slow.
    paper = Elastico(make_plan(ThresholdModel.PAPER_MEAN), ElasticoSettings(cooldown_exponent=0))
    steps = run(paper, on("fast"), 120, poisson_counter(lambda now: 4.0, seed=1))
    assert steps[-1][2].active == "slow"


def returning_bursts(now: float) -> float:
    """1 request/s, with 10 s at 10 requests/s every 40 s for the first 200 s."""
    return 10.0 if now < 200 and now % 40 >= 30 else 1.0


def test_a_burst_memory_keeps_out_what_returning_bursts_overwhelm() -> None:
    """Without a memory the policy climbs back between bursts and each burst catches it there;
    with a 60 s memory it stays on the fastest until a minute after the last burst."""
    settings = ElasticoSettings(cooldown_exponent=0)
    forgetful = run(Elastico(PLAN, settings), on("fast"), 300, poisson_counter(returning_bursts, 2))
    caught = [now for now, d in switches(forgetful) if d.action is Action.FASTER and now < 200]
    assert len(caught) >= 4

    remembering = Elastico(PLAN, replace(settings, burst_memory_s=60))
    moves = switches(run(remembering, on("fast"), 300, poisson_counter(returning_bursts, 2)))
    # Caught by the first burst (a step or two down); then no move until the memory of the
    # last burst (its last look at 199 s) has gone, and the climb to slow resumes.
    assert [now for now, d in moves if d.action is Action.FASTER and now < 200] in ([30], [30, 31])
    assert [now for now, _ in moves if 32 < now < 259] == []
    climbed = [d.target for now, d in moves if now >= 259 and d.action is Action.MORE_ACCURATE]
    assert "slow" in climbed


# A front whose second member the planner cannot tell from the fastest on the queue (the same
# stay and entry queue limits at 600 ms), only on the rate: a "queue peer" of the fastest.
PEER = profile("peer", 0.78, 104, 15)
PEER_PLAN = plan_thresholds([FAST, PEER, SLOW], Slo(600), 50)


def rate(qps: float, depth: float = 0) -> Callable[[float], Observation]:
    """A measured arrival rate (no counter) and a queue depth, the same at every observation."""
    return lambda now: Observation(now, depth, arrival_rate_qps=qps)


def test_the_queue_peer_plan_is_what_the_overload_tests_need() -> None:
    """Same queue limits as the fastest, a lower rate limit; slow differs on the queue."""
    fast, peer, slow = PEER_PLAN.thresholds
    assert (peer.stay_max_queue, peer.enter_max_queue) == (fast.stay_max_queue, 3)
    assert fast.enter_max_queue == 3
    assert peer.stay_max_qps is not None
    assert fast.stay_max_qps is not None
    assert peer.stay_max_qps < fast.stay_max_qps
    assert slow.stay_max_queue != fast.stay_max_queue


def test_in_an_overload_a_queue_peer_serves_while_the_queue_is_short() -> None:
    """Arrivals over every rate limit: the peer after its cooldown with an empty queue, the
    fastest at once when the queue passes half the limit, the peer again after a calm queue."""
    policy = Elastico(PEER_PLAN)
    fast_limit = PEER_PLAN.thresholds[0].stay_max_qps
    stay = PEER_PLAN.thresholds[1].stay_max_queue
    assert fast_limit is not None
    assert stay is not None
    overload = 1.3 * fast_limit

    def observe(now: float) -> Observation:
        # Empty for 10 s, then half the stay limit (still served by the peer), then over it.
        depth = 0 if now < 10 else stay // 2 if now < 15 else stay // 2 + 1
        return Observation(now, depth, arrival_rate_qps=overload)

    steps = run(policy, on("fast"), 20, observe)
    moved = [(now, d.target, d.action) for now, d in switches(steps)]
    assert moved == [
        (np.ceil(policy.cooldown_s(1)), "peer", Action.MORE_ACCURATE),
        (15.0, "fast", Action.FASTER),
    ]
    # Without a peer (mid is far slower than fast): the fastest holds through the overload.
    steps = run(Elastico(PLAN), on("fast"), 20, rate(20.0))
    assert not switches(steps)
    assert "overload" in steps[-1][1].reason


def test_between_the_peer_and_the_fastest_rate_limits_the_rate_still_decides() -> None:
    """Arrivals over the peer's limits but within the fastest's: no overload, so the fastest
    serves, whatever the queue (the peer's own rate limit applies as to any configuration)."""
    policy = Elastico(PEER_PLAN)
    fast, peer, _ = PEER_PLAN.thresholds
    assert fast.stay_max_qps is not None
    assert peer.stay_max_qps is not None
    between = (fast.stay_max_qps + peer.stay_max_qps) / 2
    assert not switches(run(policy, on("fast"), 60, rate(between)))
    decision, _ = policy.decide(Observation(0.0, 0, arrival_rate_qps=between), on("peer"), 0.0)
    assert (decision.action, decision.target) == (Action.FASTER, "fast")


def test_a_short_burst_does_not_restart_a_queue_peer_cooldown() -> None:
    """One observation over the peer's entry rate with a short queue: its cooldown goes on
    (the rate over the whole window decides at the end); for a configuration that is not a
    peer the same burst restarts it."""
    fast, peer, _ = PEER_PLAN.thresholds
    assert peer.enter_max_qps is not None
    assert fast.stay_max_qps is not None
    burst = (peer.enter_max_qps + fast.stay_max_qps) / 2

    def observe(now: float) -> Observation:
        return Observation(now, 0, arrival_rate_qps=burst if now == 3.0 else 2.0)

    policy = Elastico(PEER_PLAN)
    moved = switches(run(policy, on("fast"), 15, observe))
    assert moved[0][0] == np.ceil(policy.cooldown_s(1))
    assert moved[0][1].target == "peer"
    # In PLAN, mid's queue limits differ from fast's: the burst restarts its clock at t = 4.
    mid_limit = PLAN.thresholds[1].enter_max_qps
    assert mid_limit is not None
    flat = Elastico(PLAN, ElasticoSettings(cooldown_exponent=0))

    def observe_mid(now: float) -> Observation:
        return Observation(now, 0, arrival_rate_qps=mid_limit + 1 if now == 3.0 else 2.0)

    moved = switches(run(flat, on("fast"), 15, observe_mid))
    assert moved[0][0] == 9.0


def test_counter_reset_and_measured_rate() -> None:
    """A counter that goes down starts a new history; a measured rate is used as it is."""
    policy = Elastico(PLAN)
    state = on("mid")
    for now, total in ((0.0, 100.0), (1.0, 101.0), (2.0, 3.0)):
        _, state = policy.decide(Observation(now, 0, arrivals_total=total), state, now)
    assert state.arrivals == ((2.0, 3.0),)
    decision, _ = policy.decide(Observation(3.0, 0, arrival_rate_qps=50.0), state, 3.0)
    assert (decision.action, decision.target) == (Action.FASTER, "fast")
    assert "arrivals >= 50.00/s" in decision.reason


@pytest.mark.parametrize("confidence", [0.7, 0.8, 0.95])
def test_rate_bounds_cover_the_true_rate(confidence: float) -> None:
    """Each bound misses the true rate in at most about 1 - confidence of windows."""
    rng = np.random.default_rng(11)
    true_rate, window = 3.0, 2.0
    counts = rng.poisson(true_rate * window, size=20_000)
    lower = np.array([rate_lower_bound(c, window, confidence) for c in counts])
    upper = np.array([rate_upper_bound(c, window, confidence) for c in counts])
    assert np.all(lower <= counts / window + 1e-12)
    assert np.all(upper >= counts / window)
    assert np.mean(lower > true_rate) <= 1 - confidence + 0.01
    assert np.mean(upper < true_rate) <= 1 - confidence + 0.01


# ---------------------------------------------------------------------------- state


def test_state_survives_a_restart_through_json() -> None:
    """Serialising the state mid-run and continuing gives the very same decisions."""
    policy = Elastico(PLAN)

    def load(now: float) -> float:
        return 2.0 if 40 <= now < 70 else 0.6

    observe_once = poisson_counter(load, seed=5)
    observations = [observe_once(float(t)) for t in range(150)]
    depth_pattern = [0, 0, 1, 3, 7, 2, 0, 0]
    observations = [
        Observation(
            o.time, depth_pattern[int(o.time) % 8] if 40 <= o.time < 70 else 0, o.arrivals_total
        )
        for o in observations
    ]

    def straight() -> list[Decision]:
        state = policy.initial_state(0.0)
        decisions = []
        for o in observations:
            decision, state = policy.decide(o, state, o.time)
            decisions.append(decision)
        return decisions

    expected = straight()
    assert any(d.switched for d in expected)
    for cut in (17, 45, 71, 100):
        state = policy.initial_state(0.0)
        resumed = []
        for o in observations:
            if o.time == cut:
                text = json.dumps(state.to_dict())
                state = PolicyState.from_dict(json.loads(text))
            decision, state = policy.decide(o, state, o.time)
            resumed.append(decision)
        assert resumed == expected


def test_state_from_an_older_or_newer_operator() -> None:
    """Unknown keys are ignored; missing keys take their defaults."""
    state = PolicyState.from_dict({"active": "mid", "future_field": 1})
    assert state.active == "mid"
    assert state.entry_levels == ()
    assert ROUND[state.active] == 1


# ---------------------------------------------------------------------------- capacity pressure


def test_capacity_pressure_is_zero_unless_the_fastest_is_active_and_over_its_queue_limit() -> None:
    """Above 1 exactly when the fastest's queue is over its stay limit: (queue + 1) / (limit + 1);
    0 on any other entry (accuracy is still there to give up), without a queue or an active."""
    limit = PLAN.thresholds[0].stay_max_queue
    assert limit is not None
    assert limit > 0
    assert capacity_pressure(PLAN, "fast", 0) == 0.0
    assert capacity_pressure(PLAN, "fast", limit) == 0.0
    assert capacity_pressure(PLAN, "fast", limit + 1) == pytest.approx((limit + 2) / (limit + 1))
    assert capacity_pressure(PLAN, "fast", 3 * limit + 2) == pytest.approx(3.0)
    assert capacity_pressure(PLAN, "mid", 10 * limit) == 0.0
    assert capacity_pressure(PLAN, "slow", 10 * limit) == 0.0
    assert capacity_pressure(PLAN, None, 10 * limit) == 0.0
    assert capacity_pressure(PLAN, "fast", None) == 0.0
    assert capacity_pressure(PLAN, "fast", float("nan")) == 0.0
    assert capacity_pressure(PLAN, "unknown", 10 * limit) == 0.0
