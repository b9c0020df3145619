"""The runtime strategies a ParetoPolicy can choose (each a compass.domain.policy.Policy)."""

from __future__ import annotations

from enum import StrEnum

from compass.domain.committed import CommittedSplit
from compass.domain.elastico import DEFAULT_INTERVAL_S, Elastico, ElasticoSettings
from compass.domain.planner import Plan
from compass.domain.predictive import Predictive
from compass.domain.split import Split


class Strategy(StrEnum):
    """How the policy moves along the front."""

    ELASTICO = "elastico"
    SPLIT = "split"
    PREDICTIVE = "predictive"
    COMMITTED_SPLIT = "committedSplit"


# A strategy bound to its plan (each has ``plan``, the front and thresholds it decides over).
StrategyPolicy = Elastico | Split | Predictive | CommittedSplit


def build_policy(
    strategy: Strategy,
    plan: Plan,
    settings: ElasticoSettings | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> StrategyPolicy:
    """The policy of this strategy over the plan."""
    settings = settings or ElasticoSettings()
    if Strategy(strategy) is Strategy.SPLIT:
        return Split(plan, settings)
    if Strategy(strategy) is Strategy.COMMITTED_SPLIT:
        return CommittedSplit(plan, settings, interval_s)
    if Strategy(strategy) is Strategy.PREDICTIVE:
        return Predictive(plan, settings)
    return Elastico(plan, settings)
