"""The live loop stamps an observation with when its samples were taken, not when they were
read: a metrics source that keeps answering with an old sample is stale to the policy."""

from __future__ import annotations

from dataclasses import dataclass

from compass.controllers import policy_conditions, policy_status
from compass.controllers.policy_handlers import ObservingLoop
from compass.dataplane.live import LiveLoop
from compass.dataplane.metrics import MetricsReading
from compass.dataplane.triton import SwitchReport
from compass.domain.elastico import Elastico, ElasticoSettings
from compass.domain.evaluation import Config
from compass.domain.planner import Slo, plan_thresholds
from compass.domain.policy import Action, PolicyState
from compass.domain.space import config_key
from compass_dev.scenarios import normal_profile as profile

FAST = profile("fast", 0.70, 100, 15)
SLOW = profile("slow", 0.90, 250, 30)
PLAN = plan_thresholds([FAST, SLOW], Slo(1000), 50)


@dataclass
class FrozenSource:
    """A queue of 0 whose samples were taken ``age_s`` before every read."""

    age_s: float

    def describe(self) -> str:
        return "frozen"

    def read(self) -> MetricsReading:
        return MetricsReading(0.0, None, 1, age_s=self.age_s)


@dataclass
class Router:
    """Serves what it was last told to."""

    config: Config

    def active_config(self) -> str:
        return config_key(self.config)

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        self.config = config
        return SwitchReport(config_key(config), 1, 0.0)


def test_an_observation_is_as_old_as_its_samples() -> None:
    loop = LiveLoop(Elastico(PLAN), FrozenSource(age_s=2.5), Router(SLOW.config))
    observation, problem = loop.observe(100.0)
    assert problem is None
    assert observation is not None
    assert observation.time == 97.5


def test_a_frozen_series_sends_the_loop_to_the_fastest_after_stale_after() -> None:
    """Read every second, never moving: held for staleAfter, then the fastest (the default)."""
    source = FrozenSource(age_s=0.0)
    router = Router(SLOW.config)
    loop = LiveLoop(Elastico(PLAN, ElasticoSettings(stale_after_s=5)), source, router)
    state = loop.initial_state(0.0)
    assert state.active == "slow"
    actions = []
    for now in range(12):
        source.age_s = max(now - 3.0, 0.0)  # the series stopped moving at t = 3
        result = loop.step(state, float(now))
        state = result.state
        actions.append((now, result.decision.action))
    assert [now for now, action in actions if action is Action.FALLBACK] == [9]
    assert router.config == FAST.config


def test_the_operator_says_when_the_samples_are_stale() -> None:
    """Read fine, but too old: MetricsAvailable False with how old, not 'queue depth from'."""
    loop = ObservingLoop(
        policy=Elastico(PLAN),
        source=FrozenSource(age_s=12.0),
        router=Router(SLOW.config),
        stale_after_s=5.0,
    )
    observation, _ = loop.observe(100.0)
    assert observation is not None
    assert loop.metrics_problem == "metrics stale: the samples are 12.0 s old (staleAfterSeconds 5)"
    health = policy_conditions.Health(
        metrics_error=loop.metrics_problem, metrics_read=True, decision="hold"
    )
    [available] = [
        c for c in policy_conditions.health_conditions(health) if c.type == "MetricsAvailable"
    ]
    assert (available.status, available.message) == ("False", loop.metrics_problem)


def test_the_newest_sample_time_alone_waits_for_the_heartbeat() -> None:
    """observed_at moves every tick: like the arrivals, it is no reason to write the status."""
    before = {"policyState": PolicyState(observed_at=1.0).to_dict()}
    after = {"policyState": PolicyState(observed_at=2.0).to_dict()}
    assert policy_status.status_patch(before, after, now=3.0, last_write=2.5) == {}
