"""A ParetoPolicy's status: what the operator observed and decided, as the API server stores it
(compass.api.paretopolicy holds the spec; compass.api.crds builds the CRD from both)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from compass.api.conditions import CONDITIONS_SCHEMA, MAX_CONDITIONS, Condition
from compass.api.meta import CamelModel
from compass.domain.evaluation import ParamValue
from compass.domain.served import MAX_SHOWN as MAX_SERVED_SHOWN

# The status lists this many lagging pods at most: it must stay small whatever the fleet.
MAX_LAGGING_PODS = 20


class ConditionType(StrEnum):
    """The conditions a ParetoPolicy reports."""

    READY = "Ready"
    METRICS_AVAILABLE = "MetricsAvailable"
    DEGRADED = "Degraded"
    PAUSED = "Paused"
    PODS_SERVING = "PodsServing"
    PER_REQUEST_BINDING = "PerRequestBinding"


class BlendStatus(CamelModel):
    """The front member serving a share of the requests (the split strategy)."""

    name: str = Field(description="Short name: the parameter values joined by '/'.")
    index: Annotated[int, Field(ge=0, description="Position on the planned front, 0 = fastest.")]
    weight: Annotated[
        float, Field(gt=0, lt=1, description="Share of the requests it serves (5% steps).")
    ]


class ActiveConfiguration(CamelModel):
    """The configuration the router serves now, as the planned front describes it."""

    name: str = Field(description="Short name: the parameter values joined by '/'.")
    config: dict[str, ParamValue] = Field(description="The parameter values the router applies.")
    index: Annotated[int, Field(ge=0, description="Position on the planned front, 0 = fastest.")]
    accuracy: float = Field(description="Its measured accuracy.")
    latency_mean_ms: float = Field(description="Its mean service time in ms.")
    latency_p95_ms: float = Field(description="Its 95th percentile service time in ms.")
    blend: BlendStatus | None = Field(
        default=None,
        description="With the split strategy: the member serving a share of the requests "
        "(this configuration serves the rest).",
    )


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
    ttft_mean_ms: float | None = Field(
        default=None,
        description="Its profiled mean time to first token in ms (a streaming router's), if any.",
    )


class LaggingPod(CamelModel):
    """A pod that does not serve the active configuration, and why."""

    name: str = Field(description="The pod.")
    reason: str = Field(description="What it serves instead, or why it could not be reached.")


class RoutingStatus(CamelModel):
    """How many Triton pods the policy switches, and which lag behind."""

    pods: int = Field(description="Ready pods behind the routing target.")
    serving: int = Field(description="Pods serving the active configuration.")
    lagging: list[LaggingPod] = Field(
        default_factory=list,
        max_length=MAX_LAGGING_PODS,
        description=f"Pods that do not serve it (at most {MAX_LAGGING_PODS} listed).",
    )


class ServedConfiguration(CamelModel):
    """One configuration the routers served, and its share of the requests they answered."""

    name: str = Field(description="Short name: the parameter values joined by '/'.")
    share: Annotated[
        float, Field(ge=0, le=1, description="Its share of the requests answered in the window.")
    ]
    accuracy: float | None = Field(
        default=None, description="Its measured accuracy (unset: not on the planned front)."
    )


class ServedStatus(CamelModel):
    """What the routers served over the last minute, from their own counters
    (compass_router_served_total, compass_router_refused_total): with late binding, what each
    request was bound to; else what the policy routed (and admission degraded)."""

    observed_time: str = Field(
        description="When the routers' counters were read (RFC 3339): a time that stops moving "
        "says they can no longer be read, and the counts are that old."
    )
    window_seconds: Annotated[
        int, Field(ge=0, description="The span the counts cover, in s (up to 60).")
    ]
    requests: Annotated[int, Field(ge=0, description="Requests answered in the window.")]
    refused: Annotated[int, Field(ge=0, description="Requests refused as late in the window.")]
    accuracy: float | None = Field(
        default=None,
        description="The mean accuracy of the requests answered (those on the planned front).",
    )
    configurations: list[ServedConfiguration] = Field(
        default_factory=list,
        max_length=MAX_SERVED_SHOWN,
        description=f"The configurations served, most first (at most {MAX_SERVED_SHOWN}).",
    )
    ttft_mean_ms: Annotated[
        float | None,
        Field(
            ge=0,
            description="A streaming (decoupled) router's mean time to first token in the "
            "window, ms from take-up (compass_router_stream_first_seconds_total over "
            "compass_router_streams_total); unset where no router streamed.",
        ),
    ] = None
    stream_mean_ms: Annotated[
        float | None,
        Field(
            ge=0,
            description="Its streams' mean end-to-end time in the window, ms from take-up "
            "(compass_router_stream_seconds_total over compass_router_streams_total).",
        ),
    ] = None


class ParetoPolicyStatus(CamelModel):
    """What the operator observed and decided for a ParetoPolicy."""

    active: ActiveConfiguration | None = Field(
        default=None, description="The configuration the router serves now."
    )
    last_queue_depth: float | None = Field(
        default=None, description="The queue depth at the last observation."
    )
    last_observation_time: str | None = Field(
        default=None,
        description="When the samples of the last successful read were taken (RFC 3339).",
    )
    last_decision: str | None = Field(
        default=None,
        description="What the last decision did and why (one line; while nothing else changes, "
        "refreshed every 10 s).",
    )
    last_switch_time: str | None = Field(
        default=None, description="When the active configuration last changed (RFC 3339)."
    )
    last_switch_reason: str | None = Field(
        default=None, description="Why the active configuration last changed."
    )
    switches: int = Field(default=0, description="Switches made by this policy since it began.")
    routing: RoutingStatus | None = Field(
        default=None, description="The pods switched at the last decision."
    )
    thresholds: list[ThresholdStatus] = Field(
        default_factory=list, description="Queue-depth and arrival-rate limits per front member."
    )
    served: ServedStatus | None = Field(
        default=None,
        description="What the routers served over the last minute (refreshed with the status's "
        "heartbeat, every 10 s or longer with many policies; unset where the routers do not "
        "count it).",
    )
    policy_state: dict[str, Any] | None = Field(
        default=None,
        description="Elastico's runtime state (hysteresis timers, recent arrivals): a restarted "
        "operator resumes from it. Internal; times are seconds since the epoch.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Ready, MetricsAvailable, Degraded and Paused.",
        json_schema_extra=CONDITIONS_SCHEMA,
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation the status describes."
    )
