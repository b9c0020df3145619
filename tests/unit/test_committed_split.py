"""The committed split: Split for a data plane that draws each request's member at arrival (llm-d's
endpoint picker), its mix capped by the work a burst drawn under it would commit."""

from __future__ import annotations

import json

import pytest

from compass.api.paretopolicy import ParetoPolicySpec, ServingSettings
from compass.conversion import runtime_policy
from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.committed import FLOOR_SHARE, CommittedSplit, busy_interval
from compass.domain.mix import Dealing, Mix
from compass.domain.planner import Slo, ThresholdModel, plan_thresholds
from compass.domain.policy import Action, Observation, PolicyState
from compass.domain.simulator import StaticController, simulate
from compass.domain.split import Split
from compass.domain.strategy import Strategy, build_policy
from compass_dev.scenarios import normal_profile as profile

FRONT = [
    profile("fast", 0.70, 100, 15),
    profile("mid", 0.80, 150, 20),
    profile("slow", 0.90, 250, 30),
]
PLAN = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)
ON_A_MIX = PolicyState(active="fast", blend="mid", weight=0.5, active_since=0.0)


def test_a_busy_interval_is_the_slos_percentile_of_the_gaps_scaled_to_one_period() -> None:
    # Twenty one-second gaps: nineteen of 2 arrivals and one of 12.
    samples = tuple((float(t), 2.0 * t + (10.0 if t >= 20 else 0.0)) for t in range(21))
    assert busy_interval(samples, 1.0, 50.0) == 2.0
    # One busy gap in twenty is the top 5%: the 95th percentile only begins to reach it (linear
    # between the 19th and 20th of the sorted gaps); a half-second period sees half as many.
    assert busy_interval(samples, 1.0, 95.0) == pytest.approx(2.5)
    assert busy_interval(samples, 0.5, 95.0) == pytest.approx(1.25)
    assert busy_interval(samples, 1.0, 100.0) == 12.0
    assert busy_interval(((0.0, 3.0),), 1.0, 95.0) == 0.0


def test_on_quiet_arrivals_it_decides_as_split() -> None:
    calm = Observation(time=2, queue_depth=0, arrivals_total=1)
    state = PolicyState(**{**ON_A_MIX.__dict__, "arrivals": ((1.0, 0.0),)})
    split, _ = Split(PLAN).decide(calm, state, 2)
    committed, _ = CommittedSplit(PLAN).decide(calm, state, 2)
    assert committed == split
    assert committed.mix == Mix(0, 1, 0.5)


def test_with_a_queue_and_busy_arrivals_it_serves_only_the_mix_that_fits_the_slack_buffer() -> None:
    """10 requests (5 queued, 5 arriving in a busy period) at fast + 5% mid commit about 25 ms
    beyond fast's work (mid's 50 ms on a twentieth of them): within the plan's slack buffer
    (50 ms) where the queue was drawn under fast, not where it was drawn under fast + 50% mid
    (its 5 requests alone commit about 125 ms, whatever the new mix)."""
    policy = CommittedSplit(PLAN)
    fast, five, half = (
        policy.inner.mixes.index(m) for m in (Mix(0), Mix(0, 1, 0.05), Mix(0, 1, 0.5))
    )
    assert fast is not None
    assert five is not None
    assert half is not None
    assert policy.committed_ms(5, 5, fast, five) == pytest.approx(25, abs=1)
    assert policy.committed_cap(5, 5, fast, half) == five
    assert policy.committed_ms(5, 5, half, five) == pytest.approx(137.5, abs=2)
    assert policy.committed_cap(5, 5, half, half) == fast


def test_a_queue_drawn_under_a_slower_mix_sends_it_to_the_fastest() -> None:
    """On fast + 50% mid, 5 queued and 5 arriving each period: the queue stays on the mix it was
    drawn under, so no mix but fast alone keeps within the slack buffer (the old rule counted
    the queue at the new mix and kept 5% of mid)."""
    state = PolicyState(**{**ON_A_MIX.__dict__, "arrivals": ((0.0, 0.0), (1.0, 5.0))})
    observation = Observation(time=2, queue_depth=5, arrivals_total=10)
    decision, after = CommittedSplit(PLAN).decide(observation, state, 2)
    assert decision.action is Action.FASTER
    assert decision.mix == Mix(0)
    assert "5 queued and 5 arriving requests drawn at arrival would commit over 50 ms" in (
        decision.reason
    )
    assert (after.active, after.blend, after.weight) == ("fast", None, 0.0)
    assert after.switches == 1
    assert PolicyState.from_dict(json.loads(json.dumps(after.to_dict()))) == after
    # Split alone keeps the mix: its limits assume a switch reaches the queue.
    assert Split(PLAN).decide(observation, state, 2)[0].mix == Mix(0, 1, 0.5)


def steady_minute(rate: float) -> tuple[Observation, PolicyState]:
    """A minute of arrivals at ``rate`` a second on fast alone, the queue empty."""
    arrivals = tuple((float(t), rate * t) for t in range(61))
    state = PolicyState(active="fast", active_since=0.0, arrivals=arrivals[:-1])
    return Observation(time=60, queue_depth=0, arrivals_total=arrivals[-1][1]), state


def test_below_the_next_member_it_serves_what_commits_within_the_floor_share() -> None:
    """A steady 1.1 requests a second, the queue empty: Split waits out its cooldown on fast,
    the committed split serves mid on the share of requests whose busy interval commits at most
    FLOOR_SHARE of the slack buffer (15 ms: a quarter of the requests, 12.5 ms)."""
    observation, state = steady_minute(1.1)
    assert Split(PLAN).decide(observation, state, 60)[0].mix == Mix(0)
    decision, after = CommittedSplit(PLAN).decide(observation, state, 60)
    assert FLOOR_SHARE * PLAN.slack_buffer_ms == pytest.approx(15)
    assert decision.mix == Mix(0, 1, 0.25)
    assert decision.action is Action.MORE_ACCURATE
    assert "commit at most 15 ms" in decision.reason
    assert (after.active, after.blend, after.weight) == ("fast", "mid", pytest.approx(0.25))
    # No history yet: no rate evidence, so Split's decision stands.
    fresh = CommittedSplit(PLAN).decide(
        Observation(time=0, queue_depth=0, arrivals_total=0),
        PolicyState(active="fast", active_since=0.0),
        0,
    )
    assert fresh[0].mix == Mix(0)


def test_the_floor_stays_under_each_mixs_rate_limit() -> None:
    """A member as quick as fast on average but with a wide spread holds fewer requests a second
    (6.2 against 8.5): at 4 a second the floor serves it alone, at 6 only the share of it whose
    mix holds the arrivals' upper bound."""
    wide = plan_thresholds(
        [profile("fast", 0.70, 100, 15), profile("wide", 0.75, 101, 120)], Slo(1000), 50
    )
    policy = CommittedSplit(wide)
    for rate, mix in ((4.0, Mix(1)), (6.0, Mix(0, 1, 0.15))):
        observation, state = steady_minute(rate)
        assert Split(wide).decide(observation, state, 60)[0].mix == Mix(0)
        assert policy.decide(observation, state, 60)[0].mix == mix


def test_over_the_fastests_rate_limit_it_commits_nothing_beyond_the_fastest() -> None:
    """A steady minute at 1.5 times fast's rate limit, the queue empty: Split holds a mix with
    a member as quick as fast (a queue peer, judged on the queue in an overload), and what the
    mix commits would fit the slack buffer; the overload alone sends it to fast."""
    twins = plan_thresholds(
        [profile("fast", 0.70, 100, 15), profile("twin", 0.75, 102, 15)], Slo(1000), 50
    )
    limit = twins.thresholds[0].stay_max_qps
    assert limit is not None
    rate = 1.5 * limit
    arrivals = tuple((float(t), rate * t) for t in range(61))
    state = PolicyState(
        active="fast", blend="twin", weight=0.5, active_since=0.0, arrivals=arrivals[:-1]
    )
    observation = Observation(time=60, queue_depth=0, arrivals_total=arrivals[-1][1])
    policy = CommittedSplit(twins)
    assert Split(twins).decide(observation, state, 60)[0].mix == Mix(0, 1, 0.5)
    half = policy.inner.mixes.index(Mix(0, 1, 0.5))
    assert half is not None
    assert policy.committed_cap(0, rate, half, half) == half
    decision, after = policy.decide(observation, state, 60)
    assert decision.mix == Mix(0)
    assert decision.action is Action.FASTER
    assert "over the fastest's rate limit" in decision.reason
    assert (after.active, after.blend) == ("fast", None)


def test_behind_the_draw_it_keeps_static_fastests_compliance_where_split_does_not() -> None:
    """Bursty arrivals at a fifth of fast's capacity, each request's member drawn at arrival:
    split loses about two points against static fastest, the committed split keeps within one
    and still serves more accurately than fastest."""
    scenario = make_scenario(make_pattern("bursty", 2.0, 600, 1), 1)
    fastest = simulate(StaticController("fast", 0), FRONT, scenario, 1000)
    split = simulate(Split(PLAN), FRONT, scenario, 1000, dealing=Dealing.DRAW)
    committed = simulate(CommittedSplit(PLAN), FRONT, scenario, 1000, dealing=Dealing.DRAW)
    assert split.compliance < fastest.compliance - 1.0
    assert committed.compliance >= fastest.compliance - 1.0
    assert committed.mean_accuracy > fastest.mean_accuracy


def test_the_spec_builds_it_with_its_period() -> None:
    fields = {
        "front": [
            {
                "config": {"model": p.name},
                "accuracy": p.accuracy,
                "latencyMeanMs": p.mean_ms,
                "latencyP95Ms": p.p95_ms,
            }
            for p in FRONT
        ],
        "slo": {"latencyMs": 1000},
        "strategy": "committedSplit",
        "binding": {"mode": "workflow"},
        "intervalSeconds": 0.5,
    }
    policy = runtime_policy(ParetoPolicySpec.model_validate(fields))
    assert isinstance(policy, CommittedSplit)
    assert policy.interval_s == 0.5
    assert isinstance(build_policy(Strategy.COMMITTED_SPLIT, PLAN), CommittedSplit)
    # The CRD's description states the floor's share as the rule has it.
    described = ServingSettings.model_fields["strategy"].description or ""
    assert f"within {FLOOR_SHARE:g} of the buffer" in described
    with pytest.raises(ValueError, match="interval_s"):
        CommittedSplit(PLAN, interval_s=0)
