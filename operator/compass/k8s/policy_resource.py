"""The ParetoPolicy custom resource: its spec is ParetoPolicySpec (compass.domain.policy); this
module holds what the operator reports in its status.

The status carries the policy's whole runtime state (``policyState``, PolicyState.to_dict), so
an operator that restarts resumes the hysteresis timers where they were and never flips the
configuration on start. The thresholds derived from the spec live here too: they follow from
the spec, so GitOps that owns the spec never fights the operator.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from compass.domain.evaluation import ParamValue
from compass.domain.policy import CamelModel
from compass.k8s.workflow import Condition

KIND = "ParetoPolicy"
PLURAL = "paretopolicies"


class ConditionType(StrEnum):
    """The conditions a ParetoPolicy reports."""

    READY = "Ready"
    METRICS_AVAILABLE = "MetricsAvailable"
    DEGRADED = "Degraded"
    PAUSED = "Paused"


class ActiveConfiguration(CamelModel):
    """The configuration the router serves now, as the planned front describes it."""

    name: str = Field(description="Short name: the parameter values joined by '/'.")
    config: dict[str, ParamValue] = Field(description="The parameter values the router applies.")
    index: Annotated[int, Field(ge=0, description="Position on the planned front, 0 = fastest.")]
    accuracy: float = Field(description="Its measured accuracy.")
    latency_mean_ms: float = Field(description="Its mean service time in ms.")
    latency_p95_ms: float = Field(description="Its 95th percentile service time in ms.")


class ThresholdStatus(CamelModel):
    """One front member's derived limits (see compass.domain.planner)."""

    config: str = Field(description="Name of the front member.")
    eligible: bool = Field(description="Whether the policy may switch to it (slack > 0).")
    slack_ms: float = Field(description="SLO minus its tail latency, in ms.")
    stay_max_queue: int | None = Field(
        default=None, description="Largest queue depth at which it still meets the SLO."
    )
    enter_max_queue: int | None = Field(
        default=None, description="Largest queue depth at which it may be entered (slack buffer)."
    )
    stay_max_qps: float | None = Field(
        default=None, description="Highest arrival rate it can stay at (tail model)."
    )
    enter_max_qps: float | None = Field(
        default=None, description="Highest arrival rate at which it may be entered (tail model)."
    )


class ParetoPolicyStatus(CamelModel):
    """What the operator observed and decided for a ParetoPolicy."""

    active: ActiveConfiguration | None = Field(
        default=None, description="The configuration the router serves now."
    )
    last_queue_depth: float | None = Field(
        default=None, description="The queue depth at the last observation."
    )
    last_observation_time: str | None = Field(
        default=None, description="When the metrics were last read successfully (RFC 3339)."
    )
    last_decision: str | None = Field(
        default=None, description="What the last decision did and why (one line)."
    )
    last_switch_time: str | None = Field(
        default=None, description="When the active configuration last changed (RFC 3339)."
    )
    last_switch_reason: str | None = Field(
        default=None, description="Why the active configuration last changed."
    )
    switches: int = Field(default=0, description="Switches made by this policy since it began.")
    thresholds: list[ThresholdStatus] = Field(
        default_factory=list, description="Queue-depth and arrival-rate limits per front member."
    )
    policy_state: dict[str, Any] | None = Field(
        default=None,
        description="Elastico's runtime state (hysteresis timers, recent arrivals): a restarted "
        "operator resumes from it. Internal; times are seconds since the epoch.",
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, MetricsAvailable, Degraded and Paused."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation the status describes."
    )
