"""One policy step against real metrics and routers. Every step switches (idempotent), so a new
pod catches up within one interval; a switch no pod takes is not recorded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from compass.dataplane.fleet import FleetSwitch
from compass.dataplane.metrics import MetricsUnavailableError, QueueDepthSource
from compass.dataplane.triton import RoutingError, SwitchReport, parse_routing_key
from compass.domain.evaluation import Config
from compass.domain.policy import Decision, Observation, PolicyState
from compass.domain.strategy import StrategyPolicy


class Router(Protocol):
    """What the loop switches: one Triton's router (TritonRouter) or every pod's (RouterFleet)."""

    def active_config(self) -> str:
        """Canonical key of the configuration served now."""
        ...

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        """Make ``config`` (with ``blend`` serving ``weight``) active, or RoutingError."""
        ...


@dataclass(frozen=True)
class StepResult:
    """What one step saw and did; ``routing``: its routing call's report, switch or hold."""

    observation: Observation | None
    decision: Decision
    state: PolicyState
    switch: SwitchReport | None
    problem: str | None
    routing: SwitchReport | None = None

    @property
    def switched(self) -> bool:
        """Whether the routing really changed in this step."""
        return self.switch is not None


@dataclass
class LiveLoop:
    """The policy wired to one metrics source and one router (or a fleet of them)."""

    policy: StrategyPolicy
    source: QueueDepthSource
    router: Router
    arrival_rate: Callable[[], float | None] | None = None

    def initial_state(self, now: float) -> PolicyState:
        """Start from what the router serves (off the front: empty, so the fastest next)."""
        base, blend, weight = parse_routing_key(self.router.active_config())
        names = {t.profile.key: t.profile.name for t in self.policy.plan.thresholds}
        if base not in names or (blend is not None and blend not in names):
            return PolicyState()
        return PolicyState(
            active=names[base],
            blend=None if blend is None else names[blend],
            weight=weight,
            active_since=now,
            last_reason="found active",
        )

    def observe(self, now: float) -> tuple[Observation | None, str | None]:
        """The current observation, or None and what went wrong."""
        try:
            reading = self.source.read()
            rate = self.arrival_rate() if self.arrival_rate is not None else None
        except MetricsUnavailableError as error:
            return None, f"metrics unavailable: {error}"
        # Stamped when its samples were taken, so a series that stopped moving goes stale.
        return Observation(
            time=now - reading.age_s,
            queue_depth=reading.queue_depth,
            arrivals_total=reading.arrivals_total,
            arrival_rate_qps=rate,
            pods=reading.pods,
        ), None

    def step(self, state: PolicyState, now: float) -> StepResult:
        """Observe, decide, actuate; the returned state is what is really active."""
        observation, problem = self.observe(now)
        decision, proposed = self.policy.decide(observation, state, now)
        thresholds = self.policy.plan.thresholds
        config = thresholds[decision.index].profile.config
        blend = None if decision.blend_index is None else thresholds[decision.blend_index]
        try:
            report = self.router.switch(
                config, None if blend is None else blend.profile.config, decision.weight
            )
        except RoutingError as error:
            if not decision.switched:
                note = f"routing of {decision.target} not confirmed: {error}"
                return StepResult(observation, decision, proposed, None, _join(problem, note))
            # The router still serves the old configuration: keep the old state and its timers.
            held = replace(state, last_reason=f"switch to {decision.target} failed: {error}")
            note = f"holding {state.active}: switch to {decision.target} failed: {error}"
            return StepResult(observation, decision, held, None, note)
        if isinstance(report, FleetSwitch) and report.lagging:
            lagging = ", ".join(f"{p.pod} ({p.error or p.config})" for p in report.lagging)
            problem = _join(problem, f"pods not serving {decision.target}: {lagging}")
        switch = report if decision.switched else None
        return StepResult(observation, decision, proposed, switch, problem, report)


def _join(first: str | None, second: str) -> str:
    return second if first is None else f"{first}; {second}"
