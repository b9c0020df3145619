"""The runtime strategies a ParetoPolicy can choose, behind one protocol.

Each is a pure ``decide(observation, state, now) -> (decision, state)`` over a plan, so the
simulator, the tests and the operator run the same code (KEDA's scalers are chosen the same
way: an enum in the spec, one implementation each).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from compass.domain.elastico import Decision, Elastico, ElasticoSettings, Observation, PolicyState
from compass.domain.planner import Plan
from compass.domain.predictive import Predictive
from compass.domain.split import Split


class Strategy(StrEnum):
    """How the policy moves along the front."""

    ELASTICO = "elastico"
    SPLIT = "split"
    PREDICTIVE = "predictive"


class Policy(Protocol):
    """A strategy bound to its plan."""

    @property
    def plan(self) -> Plan:
        """The front and thresholds it decides over."""
        ...

    def initial_state(self, now: float) -> PolicyState:
        """The state before the first decision."""
        ...

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The routing after this observation and the new state."""
        ...


def build_policy(
    strategy: Strategy,
    plan: Plan,
    settings: ElasticoSettings | None = None,
) -> Policy:
    """The policy of this strategy over the plan."""
    settings = settings or ElasticoSettings()
    if Strategy(strategy) is Strategy.SPLIT:
        return Split(plan, settings)
    if Strategy(strategy) is Strategy.PREDICTIVE:
        return Predictive(plan, settings)
    return Elastico(plan, settings)
