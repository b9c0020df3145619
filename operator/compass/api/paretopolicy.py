"""The ParetoPolicy's spec: the front, the SLO and how it serves (compass.api.paretopolicy_status
holds the status; ``compass.conversion`` turns a spec into the domain's plan and policy)."""

from __future__ import annotations

import itertools
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, model_validator

from compass.api.binding import BindingSettings
from compass.api.gateway import HttpRouteTarget
from compass.api.meta import CamelModel
from compass.api.metricsource import MetricsSource
from compass.api.routing import RoutingTarget
from compass.api.rules import CelRule, cel_rules
from compass.domain.admission import DEFAULT_DEGRADE_AFTER
from compass.domain.capacity import (
    MAX_CURVE_POINTS,
    MAX_LATENCY_MS,
    MIN_LATENCY_MS,
    CapacityError,
    parse_curve,
)
from compass.domain.elastico import (
    DEFAULT_COOLDOWN_EXPONENT,
    DEFAULT_DOWNSCALE_COOLDOWN_S,
    DEFAULT_INTERVAL_S,
    DEFAULT_STALE_AFTER_S,
    MAX_BURST_MEMORY_S,
    MAX_COOLDOWN_EXPONENT,
    MAX_COOLDOWN_S,
    MAX_INTERVAL_S,
    MAX_STALE_AFTER_S,
    MetricsLoss,
)
from compass.domain.evaluation import ParamValue
from compass.domain.planner import ThresholdModel
from compass.domain.profiles import MAX_COMPONENTS
from compass.domain.space import MAX_PARAMETERS, config_key
from compass.domain.strategy import Strategy

DEFAULT_SLACK_BUFFER_MS = 50.0
# The sound model is the default: at 1.5 requests/s and a 500 ms SLO the paper's model keeps
# the most accurate configuration (it misses 13% of requests there) because its queue is empty
# at every decision; see bench/serving_sim.py for both models side by side.
DEFAULT_THRESHOLD_MODEL = ThresholdModel.TAIL
# Bounds the CEL rules on front entries: the server's cost estimate multiplies a rule's cost by
# how many entries the list may hold. A Pareto front has tens of entries.
MAX_FRONT = 1024
# A router's instances (a bound for the schema; Triton runs far fewer per GPU).
MAX_ROUTER_INSTANCES = 1024


def _latency_ms(description: str) -> Any:
    """A latency or SLO field in ms: a microsecond to an hour."""
    # Past either end a queueing model is meaningless, and the planner's arithmetic loses its
    # precision (a mean of 1e-300 ms) or overflows (exp of rate x time on 2**63 ms).
    return Field(ge=MIN_LATENCY_MS, le=MAX_LATENCY_MS, description=description)


class CurvePointSpec(CamelModel):
    """What a pod did at one offered rate of its capacity curve."""

    offered_qps: Annotated[float, Field(gt=0, description="Requests per second offered.")]
    throughput_qps: Annotated[float, Field(gt=0, description="Requests per second served.")]
    latency_mean_ms: Annotated[float, _latency_ms("Mean latency in ms.")]
    latency_p50_ms: Annotated[float, _latency_ms("Median latency in ms.")]
    latency_p95_ms: Annotated[float, _latency_ms("95th percentile latency in ms.")]
    latency_p99_ms: Annotated[float, _latency_ms("99th percentile latency in ms.")]
    growing: bool = Field(
        default=False,
        description="The latency still grew at the end of this rate's run (saturated).",
    )


class CapacitySpec(CamelModel):
    """A configuration's measured latency-throughput curve (the threshold model ``measured``)."""

    servers: Annotated[
        int, Field(ge=1, description="Router instances per pod the curve was measured at.")
    ]
    points: list[CurvePointSpec] = Field(
        min_length=1,
        max_length=MAX_CURVE_POINTS,
        description=f"One point per offered rate, ascending; at most {MAX_CURVE_POINTS}.",
    )
    slo_ms: Annotated[
        float | None,
        _latency_ms(
            "The latency budget in ms the ladder measured the curve's low end for "
            "(it halved its lowest rate only while that rate's latency was over it); absent: "
            "for any budget."
        ),
    ] = None

    @model_validator(mode="after")
    def _valid_curve(self) -> CapacitySpec:
        """The domain curve's checks: rates ascending, percentiles ordered."""
        try:
            parse_curve(self.model_dump(by_alias=False), "capacity")
        except CapacityError as error:
            raise ValueError(f"{error.field.removeprefix('capacity.')}: {error.what}") from None
        return self


class FrontEntry(CamelModel):
    """One configuration of the Pareto front with its accuracy and measured service time."""

    config: dict[str, ParamValue] = Field(
        min_length=1,
        max_length=MAX_PARAMETERS,
        description="The configuration's parameter values (the router applies them).",
    )
    accuracy: Annotated[float, Field(ge=0, le=1, description="Measured accuracy in [0, 1].")]
    latency_mean_ms: Annotated[float, _latency_ms("Mean service time in ms.")]
    latency_p95_ms: Annotated[float, _latency_ms("95th percentile service time in ms.")]
    latency_p50_ms: Annotated[
        float | None, _latency_ms("Median service time in ms, if measured.")
    ] = None
    latency_p99_ms: Annotated[
        float | None, _latency_ms("99th percentile service time in ms, if measured.")
    ] = None
    latency_std_ms: Annotated[
        float | None,
        Field(ge=0, le=MAX_LATENCY_MS, description="Standard deviation of the service time in ms."),
    ] = None
    capacity: CapacitySpec | None = Field(
        default=None,
        description="The latency-throughput curve at the deployed router instances, if measured.",
    )
    component_ms: (
        dict[
            Annotated[str, Field(min_length=1, max_length=253)],
            Annotated[float, Field(ge=0, le=MAX_LATENCY_MS)],
        ]
        | None
    ) = Field(
        default=None,
        max_length=MAX_COMPONENTS,
        description="Each component model's mean time in ms at idle, as the router timed its "
        "calls while profiling: late binding splits the entry's time over its stages by "
        "them (else by a fit of the front's end-to-end times).",
    )
    ttft_mean_ms: Annotated[
        float | None,
        _latency_ms(
            "Mean time to first token in ms (a streaming router's first streamed "
            "response), if profiled; not above latencyMeanMs."
        ),
    ] = None
    ttft_p50_ms: Annotated[
        float | None, _latency_ms("Median time to first token in ms, if profiled.")
    ] = None
    ttft_p95_ms: Annotated[
        float | None,
        _latency_ms(
            "95th percentile time to first token in ms, if profiled; not above latencyP95Ms."
        ),
    ] = None

    # The same rules as _percentiles_ordered, for the API server.
    model_config = cel_rules(
        CelRule(
            rule="!has(self.latencyP50Ms) || self.latencyP50Ms <= self.latencyP95Ms",
            message="latencyP95Ms is below latencyP50Ms; percentiles must not decrease",
            field_path=".latencyP95Ms",
        ),
        CelRule(
            rule="!has(self.latencyP99Ms) || self.latencyP95Ms <= self.latencyP99Ms",
            message="latencyP99Ms is below latencyP95Ms; percentiles must not decrease",
            field_path=".latencyP99Ms",
        ),
        CelRule(
            rule="self.latencyMeanMs"
            " <= (has(self.latencyP99Ms) ? self.latencyP99Ms : self.latencyP95Ms)",
            message="latencyMeanMs is above the highest percentile (latencyP99Ms if given, "
            "else latencyP95Ms)",
            field_path=".latencyMeanMs",
        ),
        # The same rules as _first_token_within, for the API server.
        CelRule(
            rule="!has(self.ttftMeanMs) || self.ttftMeanMs <= self.latencyMeanMs",
            message="ttftMeanMs is above latencyMeanMs; a first token comes before the "
            "request ends: check the profile's units",
            field_path=".ttftMeanMs",
        ),
        CelRule(
            rule="!has(self.ttftP95Ms) || self.ttftP95Ms <= self.latencyP95Ms",
            message="ttftP95Ms is above latencyP95Ms; a first token comes before the "
            "request ends: check the profile's units",
            field_path=".ttftP95Ms",
        ),
        CelRule(
            rule="!has(self.ttftP50Ms) || !has(self.ttftP95Ms) || self.ttftP50Ms <= self.ttftP95Ms",
            message="ttftP95Ms is below ttftP50Ms; percentiles must not decrease",
            field_path=".ttftP95Ms",
        ),
    )

    @model_validator(mode="after")
    def _percentiles_ordered(self) -> FrontEntry:
        ordered = [
            (name, value)
            for name, value in (
                ("latencyP50Ms", self.latency_p50_ms),
                ("latencyP95Ms", self.latency_p95_ms),
                ("latencyP99Ms", self.latency_p99_ms),
            )
            if value is not None
        ]
        for (low_name, low), (high_name, high) in itertools.pairwise(ordered):
            if high < low:
                raise ValueError(f"{high_name} {high:g} is below {low_name} {low:g}")
        if self.latency_mean_ms > ordered[-1][1]:
            raise ValueError(
                f"latencyMeanMs {self.latency_mean_ms:g} is above {ordered[-1][0]} "
                f"{ordered[-1][1]:g}"
            )
        return self

    @model_validator(mode="after")
    def _first_token_within(self) -> FrontEntry:
        for name, first, whole_name, whole in (
            ("ttftMeanMs", self.ttft_mean_ms, "latencyMeanMs", self.latency_mean_ms),
            ("ttftP95Ms", self.ttft_p95_ms, "latencyP95Ms", self.latency_p95_ms),
        ):
            if first is not None and first > whole:
                raise ValueError(
                    f"{name} {first:g} is above {whole_name} {whole:g}: a first token comes "
                    "before the request ends; check the profile's units"
                )
        low, high = self.ttft_p50_ms, self.ttft_p95_ms
        if low is not None and high is not None and high < low:
            raise ValueError(f"ttftP95Ms {high:g} is below ttftP50Ms {low:g}")
        return self


class SloSpec(CamelModel):
    """The latency objective at a percentile of requests."""

    latency_ms: Annotated[float, _latency_ms("Latency target in milliseconds.")]
    percentile: Annotated[
        float, Field(gt=0, lt=100, description="Percentile of requests held to the target.")
    ] = 95.0


class Hysteresis(CamelModel):
    """How eagerly the policy switches: fast towards speed, slowly towards accuracy."""

    upscale_cooldown_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_COOLDOWN_S,
            description="Minimum time after a switch before switching faster.",
        ),
    ] = 0.0
    downscale_cooldown_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_COOLDOWN_S,
            description="How long the entry condition of a configuration about as fast as the "
            "fastest must hold before switching to it.",
        ),
    ] = DEFAULT_DOWNSCALE_COOLDOWN_S
    cooldown_exponent: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_COOLDOWN_EXPONENT,
            description="A slower configuration's cooldown is the downscale cooldown times "
            "(its mean service time / the fastest's) to this power (capped at "
            f"{MAX_COOLDOWN_S:g} s); 0: one cooldown for all.",
        ),
    ] = DEFAULT_COOLDOWN_EXPONENT
    slack_buffer_ms: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_LATENCY_MS,
            description="Latency headroom required to switch to a more accurate one.",
        ),
    ] = DEFAULT_SLACK_BUFFER_MS
    burst_memory_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_BURST_MEMORY_S,
            description="How long a burst is remembered: no configuration is entered while a "
            "look within this many seconds showed arrivals over its rate limit (0: at once). "
            "Set it when bursts come back, as on a busy web front end.",
        ),
    ] = 0.0


class AdmissionSettings(CamelModel):
    """What the routers do with a request that would miss its deadline (admission at dispatch)."""

    enabled: bool | None = Field(
        default=None,
        description="Judge each request when a router instance takes it up, by its deadline "
        "(request parameter compass_deadline_ns, ns since the epoch, set by the client or "
        "gateway; behind the routers' gate, its arrival + the SLO where it carries none): "
        "served as routed (or bound) if that fits what is left, else on the fastest if that "
        "fits, else refused with UNAVAILABLE (retryable). Unset: on where the routers bind each "
        "request (binding.mode per-request, the default), off for whole-workflow serving.",
    )
    quantile: Annotated[
        float,
        Field(
            gt=0,
            lt=1,
            description="The quantile of each front entry's service time a request is judged on "
            "(0.5: refuse only what is more likely late than not).",
        ),
    ] = 0.5
    degrade_after: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="A request that has waited more than this share of the SLO is served on "
            "the fastest entry even where its routed one would fit: a long wait means a queue "
            "behind it, and the fastest shortens it at once (1: only what would be late). Late "
            "binding applies it where admission is on and binding.lagShare is unset (such a "
            "request binds the fastest completion): the lag cap replaces it.",
        ),
    ] = DEFAULT_DEGRADE_AFTER
    refuse: bool = Field(
        default=True,
        description="Refuse a request that would be late whatever serves it (UNAVAILABLE, "
        "retryable): it frees the queue for the requests behind it. false: serve it on the "
        "fastest entry instead (for clients that cannot retry); it is still late, and holds up "
        "the requests behind it the least.",
    )


class PolicyMode(StrEnum):
    """Whether the policy acts on the data plane or only says what it would do."""

    ACTIVE = "active"
    # Every decision made and published (status, metrics, Events), nothing switched or sent.
    ADVISORY = "advisory"


class ServingSettings(CamelModel):
    """How a policy serves its front: what a CompoundWorkflow hands its generated ParetoPolicy."""

    hysteresis: Hysteresis = Field(
        default_factory=Hysteresis, description="Cooldowns and the slack buffer."
    )
    threshold_model: ThresholdModel = Field(
        default=DEFAULT_THRESHOLD_MODEL,
        description="tail: percentile of the queued work and M/G/1 arrival-rate limits; "
        "paper-mean: the paper's N * mean + p95 <= SLO; erlang-c: M/G/c with routerInstances "
        "servers per pod; measured: each front entry's capacity curve (erlang-c for an entry "
        "without one).",
    )
    router_instances: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_ROUTER_INSTANCES,
            description="Requests a pod's router serves at once (its instance_group count); "
            "the erlang-c and measured models plan for it.",
        ),
    ] = 1
    metrics: MetricsSource | None = Field(
        default=None, description="Where the queue depth is read (not needed to simulate)."
    )
    on_metrics_loss: MetricsLoss = Field(
        default=MetricsLoss.FASTEST,
        description="Once no fresh queue depth has been read for staleAfterSeconds: fastest "
        "(the default) switches to the fastest configuration, hold keeps the active one. "
        "Fastest, because a queue that grows unseen on an accurate configuration breaks the "
        "SLO, while the fastest only costs accuracy until the metrics return.",
    )
    stale_after_seconds: Annotated[
        float,
        Field(
            gt=0,
            le=MAX_STALE_AFTER_S,
            description="A reading whose samples are older than this counts as missing (their "
            "own timestamps: a Prometheus series that stopped moving goes stale); until the "
            "newest sample is this old the policy holds through failed reads. Keep it above "
            "the scrape interval.",
        ),
    ] = DEFAULT_STALE_AFTER_S
    switch_delay_ms: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_LATENCY_MS,
            description="How long a switch takes to reach every pod (its p95; "
            "bench/serving_triton.py measures it): the queue limits leave it out of the SLO.",
        ),
    ] = 0.0
    interval_seconds: Annotated[
        float, Field(gt=0, le=MAX_INTERVAL_S, description="Time between two decisions.")
    ] = DEFAULT_INTERVAL_S
    admission: AdmissionSettings = Field(
        default_factory=AdmissionSettings,
        description="Admission at dispatch (off by default): the routers serve a request that "
        "would miss its deadline on the fastest entry, or refuse it (refuse: false never does).",
    )
    strategy: Strategy = Field(
        default=Strategy.ELASTICO,
        description="elastico: switch between front members (the paper's policy); split: also "
        "serve a share of the requests (5% steps) with the next more accurate member, so "
        "capacity and accuracy move in small steps; predictive: each interval, the most accurate "
        "mix along the front whose next 10 s, forecast from the queue and the arrival rate, "
        "misses at most 8% more than the fastest would, also through a 2.5x surge for 3 s "
        "(no cooldowns: hysteresis's cooldowns "
        "and burst memory do not apply; meant to run with admission; bench/serving_sim.py "
        "compares them); committedSplit: split for a data plane that fixes each request's member "
        "as it arrives (the llm-d gateway), its mix capped so that the queue (each request at "
        "the slower of the mix it was drawn under and the new one) and a busy interval's "
        "arrivals (the SLO's percentile of the recent ones) commit at most the slack buffer of "
        "work beyond the fastest member's, and the fastest alone while the arrivals are over "
        "its rate limit; below the next front member it serves, past split's cooldowns, the "
        "most accurate mix whose work stays within 0.3 of the buffer and whose rate limit "
        "holds the arrivals.",
    )
    mode: PolicyMode = Field(
        default=PolicyMode.ACTIVE,
        description="active (the default): the policy switches the routers and sends them its "
        "tables. advisory: every decision is made and published (status, Events WouldSwitch, "
        "compass_advisory_switches_total) and nothing is switched or sent to the routers; set "
        "active again and the routers take the policy's configuration at its next decision, "
        "with no restart.",
    )
    binding: BindingSettings = Field(
        default_factory=BindingSettings,
        description="Late binding: who chooses each request's configuration.",
    )

    @property
    def admits(self) -> bool:
        """Whether the routers judge requests at dispatch (admission.enabled, else per-request
        binding's default: on)."""
        enabled = self.admission.enabled
        return self.binding.mode.per_request if enabled is None else enabled

    @model_validator(mode="before")
    @classmethod
    def _forecaster_removed(cls, data: Any) -> Any:
        # Its own message: extra="forbid" would only call it an extra input.
        if isinstance(data, dict) and "forecaster" in data:
            raise ValueError(
                "forecaster: removed (no forecaster served better than predictive's own "
                "reading of the arrivals); delete the field"
            )
        return data


class ParetoPolicySpec(ServingSettings):
    """A Pareto front of configurations and the rules for switching between them."""

    front: list[FrontEntry] = Field(
        min_length=1,
        max_length=MAX_FRONT,
        description="The Pareto front, fastest first (the planner re-derives it); at most "
        f"{MAX_FRONT} entries.",
    )
    slo: SloSpec = Field(description="The latency SLO the policy keeps.")
    routing: RoutingTarget | None = Field(
        default=None, description="The router to switch (not needed to simulate)."
    )
    paused: bool = Field(
        default=False,
        description='Hold the active configuration (the annotation compass.io/paused: "true" '
        "does too, without touching the spec). A workflow's re-plan never sets it.",
    )

    @model_validator(mode="after")
    def _distinct_configs(self) -> ParetoPolicySpec:
        seen: dict[str, int] = {}
        for index, entry in enumerate(self.front):
            key = config_key(entry.config)
            if key in seen:
                raise ValueError(
                    f"front[{index}].config is the same configuration as front[{seen[key]}]"
                )
            seen[key] = index
        return self

    @model_validator(mode="after")
    def _gateway_serves_the_front(self) -> ParetoPolicySpec:
        routing = self.routing
        gateway = None if routing is None else routing.gateway
        if routing is None or gateway is None:
            return self
        actuator = routing.actuator.value
        pools = isinstance(gateway, HttpRouteTarget)
        field, served = ("httpRoute", "InferencePool") if pools else ("modelRewrite", "model")
        if self.binding.mode.per_request:
            raise ValueError(
                f"binding.mode: the gateway (routing.actuator {actuator}) draws each "
                f"request's {served} by weight and cannot bind per request; set binding.mode: "
                "workflow"
            )
        if self.admission.enabled:
            raise ValueError(
                f"admission.enabled: the gateway (routing.actuator {actuator}) has no "
                "admission at dispatch; remove it"
            )
        seen: dict[str, int] = {}
        for index, entry in enumerate(self.front):
            name = entry.config.get(gateway.parameter)
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"front[{index}].config: no {served} name in {gateway.parameter!r} "
                    f"(routing.{field}.parameter); give every entry the {served} it serves "
                    "there"
                )
            if name in seen:
                raise ValueError(
                    f"front[{index}].config.{gateway.parameter}: {name!r} is front"
                    f"[{seen[name]}]'s {served} too, and the gateway tells members apart by "
                    f"{served} alone; give each entry its own {served}"
                )
            seen[name] = index
        return self

    @model_validator(mode="after")
    def _stages_name_front_parameters(self) -> ParetoPolicySpec:
        if not self.binding.mode.per_request:
            return self
        if not self.binding.stages:
            # The whole configuration is one stage: every entry binds the same parameters.
            names = set(self.front[0].config)
            for index, entry in enumerate(self.front):
                if set(entry.config) != names:
                    raise ValueError(
                        f"front[{index}].config: parameters {sorted(entry.config)} are not "
                        f"front[0]'s {sorted(names)}; per-request binding binds one set of "
                        "parameters: give every entry the same ones, or binding.mode workflow"
                    )
            return self
        for s, stage in enumerate(self.binding.stages):
            for name in stage.parameters:
                for index, entry in enumerate(self.front):
                    if name not in entry.config:
                        raise ValueError(
                            f"binding.stages[{s}].parameters: {name!r} is not a parameter of "
                            f"front[{index}].config; name the parameters the front sets"
                        )
        return self
