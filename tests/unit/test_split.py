"""The split strategy: thresholds of mixes, and Elastico's decision over them."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import numpy as np
import pytest

from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.elastico import Elastico, steady_window
from compass.domain.mix import WEIGHT_STEPS, Mix
from compass.domain.planner import Slo, ThresholdModel, plan_mixes, plan_thresholds
from compass.domain.policy import Action, Decision, Observation, PolicyState
from compass.domain.simulator import simulate
from compass.domain.split import Split
from compass.domain.strategy import Strategy, build_policy
from compass_dev.scenarios import normal_profile as profile

FRONT = [
    profile("fast", 0.70, 100, 15),
    profile("mid", 0.80, 150, 20),
    profile("slow", 0.90, 250, 30),
]
PLAN = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)


@dataclass(frozen=True)
class StaticMix:
    """Always serves one mix (the simulator's view of a router with fixed weights)."""

    mix: Mix

    def initial_state(self, now: float) -> PolicyState:
        """On the mix from the start."""
        blend = None if self.mix.blend is None else FRONT[self.mix.blend].name
        return PolicyState(active=FRONT[self.mix.base].name, blend=blend, weight=self.mix.weight)

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """Never changes."""
        mix = self.mix
        blend = None if mix.blend is None else FRONT[mix.blend].name
        decision = Decision(
            FRONT[mix.base].name, mix.base, Action.HOLD, "static", blend, mix.blend, mix.weight
        )
        return decision, state


def test_the_mix_plan_walks_the_front_in_weight_steps() -> None:
    mixes = plan_mixes(PLAN)
    assert len(mixes.mixes) == WEIGHT_STEPS * 2 + 1
    assert mixes.mixes[0] == Mix(0)
    assert mixes.mixes[-1] == Mix(2)
    assert mixes.mixes[WEIGHT_STEPS] == Mix(1)
    # A pure member keeps its own thresholds.
    assert mixes.plan.thresholds[WEIGHT_STEPS] == PLAN.thresholds[1]
    accuracy = [t.profile.accuracy for t in mixes.plan.thresholds]
    mean = [t.profile.mean_ms for t in mixes.plan.thresholds]
    rates = [t.stay_max_qps for t in mixes.plan.thresholds]
    assert all(a < b for a, b in itertools.pairwise(accuracy))
    assert all(a < b for a, b in itertools.pairwise(mean))
    assert all(a is not None and b is not None and a > b for a, b in itertools.pairwise(rates))
    quarter = mixes.plan.thresholds[mixes.index(Mix(0, 1, 0.25)) or 0]
    assert quarter.profile.accuracy == pytest.approx(0.75 * 0.70 + 0.25 * 0.80)
    assert quarter.profile.mean_ms == pytest.approx(0.75 * 100 + 0.25 * 150, rel=0.01)


@pytest.mark.parametrize("mix", [Mix(0, 1, 0.5), Mix(1, 2, 0.3)])
def test_a_mix_rate_limit_is_where_the_simulated_misses_reach_the_percentile(mix: Mix) -> None:
    """Served at its stay rate limit, a mix misses the SLO for about 5% of the requests."""
    threshold = plan_mixes(PLAN).plan.thresholds[plan_mixes(PLAN).index(mix) or 0]
    assert threshold.stay_max_qps is not None
    missed = []
    for seed in range(3):
        scenario = make_scenario(make_pattern("constant", threshold.stay_max_qps, 3000), seed)
        report = simulate(StaticMix(mix), FRONT, scenario, 1000)
        shares = np.bincount(report.configs, minlength=3) / report.requests
        assert shares[mix.blend or 0] == pytest.approx(mix.weight, abs=0.01)
        missed.append(1 - report.compliance / 100)
    assert np.mean(missed) == pytest.approx(0.05, abs=0.012)


def test_between_two_members_limits_split_serves_a_mix_and_more_accuracy() -> None:
    """At a load the fast member holds and the mid one does not, Elastico stays on the fast one
    while split serves a share with the mid one, within the SLO."""
    fast, mid = PLAN.thresholds[0].enter_max_qps, PLAN.thresholds[1].stay_max_qps
    assert fast is not None
    assert mid is not None
    rate = mid + 0.6 * (fast - mid)
    scenario = make_scenario(make_pattern("constant", rate, 600), 4)
    elastico = simulate(Elastico(PLAN), FRONT, scenario, 1000)
    split = simulate(Split(PLAN), FRONT, scenario, 1000)
    assert elastico.time_in_config_s[1] < 30
    assert split.mean_accuracy > elastico.mean_accuracy + 0.01
    assert split.compliance >= 95.0
    # Most of the time on a mix of the two, never on mid alone.
    mixed = [t.mix for t in split.ticks if t.mix is not None and t.mix.blend == 1]
    assert len(mixed) > 0.7 * len(split.ticks)
    assert split.time_in_config_s[2] == 0


def test_a_queue_over_the_mix_limit_leaves_it_at_once() -> None:
    policy = Split(PLAN)
    state = PolicyState(active="mid", blend="slow", weight=0.5, active_since=0.0)
    decision, after = policy.decide(Observation(time=10, queue_depth=50), state, 10)
    assert decision.action is Action.FASTER
    assert decision.mix == Mix(0)
    assert (after.active, after.blend, after.weight) == ("fast", None, 0.0)


def test_the_state_names_the_mix_and_survives_json() -> None:
    policy = Split(PLAN)
    state = PolicyState(active="fast", blend="mid", weight=0.35, active_since=0.0)
    decision, after = policy.decide(Observation(time=1, queue_depth=0), state, 1)
    assert decision.mix == Mix(0, 1, 0.35)
    assert (decision.target, decision.blend) == ("fast", "mid")
    restored = PolicyState.from_dict(json.loads(json.dumps(after.to_dict())))
    assert restored == after
    again, _ = policy.decide(Observation(time=2, queue_depth=0), restored, 2)
    assert again.mix == Mix(0, 1, 0.35)


def test_a_mix_that_is_not_on_the_plan_falls_back_to_the_fastest() -> None:
    policy = Split(PLAN)
    # fast with slow skips mid: not a mix of neighbours.
    state = PolicyState(active="fast", blend="slow", weight=0.5, active_since=0.0)
    decision, after = policy.decide(Observation(time=1, queue_depth=0), state, 1)
    assert decision.action is Action.FALLBACK
    assert decision.mix == Mix(0)
    assert "not eligible" in decision.reason
    assert after.blend is None


def test_the_strategy_enum_builds_each_policy() -> None:
    assert isinstance(build_policy(Strategy.ELASTICO, PLAN), Elastico)
    split = build_policy(Strategy.SPLIT, PLAN)
    assert isinstance(split, Split)
    assert split.plan is PLAN


def _counter(rates: list[float]) -> tuple[tuple[float, float], ...]:
    """Counter samples once a second for these per-second arrival counts."""
    total, samples = 0.0, [(0.0, 0.0)]
    for second, rate in enumerate(rates, start=1):
        total += rate
        samples.append((float(second), total))
    return tuple(samples)


def test_the_steady_window_grows_over_a_steady_rate_and_shrinks_at_a_change() -> None:
    steady = _counter([2.0] * 200)
    count, seconds = steady_window(steady, 200.0) or (0, 0)
    assert seconds == 128.0
    assert count == 256
    risen = _counter([2.0] * 195 + [8.0] * 5)
    _, seconds = steady_window(risen, 200.0) or (0, 0)
    assert seconds <= 4.0
    fallen = _counter([8.0] * 190 + [1.0] * 10)
    _, seconds = steady_window(fallen, 200.0) or (0, 0)
    assert seconds <= 8.0
    assert steady_window(_counter([2.0]), 1.0) is None


def test_clumps_counted_as_fewer_arrivals_are_not_a_change_of_the_rate() -> None:
    """10 at once every 5 s: at a lull after a clump, a Poisson reading sees a fall and keeps a
    short window; counted as a tenth as many independent arrivals, the window spans minutes."""
    clumped = _counter([10.0 if t % 5 == 0 else 0.0 for t in range(200)])
    _, seconds = steady_window(clumped, 200.0) or (0, 0)
    assert seconds <= 8.0
    count, seconds = steady_window(clumped, 200.0, dispersion=10.0) or (0, 0)
    assert seconds == 128.0
    assert count in (25, 26)  # 250 or 260 arrivals in clumps of 10
    assert steady_window(clumped, 200.0, dispersion=1.0) == steady_window(clumped, 200.0)


def test_elastico_taking_over_a_mix_ends_the_blend() -> None:
    state = PolicyState(active="fast", blend="mid", weight=0.35, active_since=0.0)
    decision, after = Elastico(PLAN).decide(Observation(time=1, queue_depth=0), state, 1)
    assert decision.mix == Mix(0)
    assert (after.blend, after.weight) == (None, 0.0)
