"""Pure decisions of the ParetoPolicy controller; the kopf timer (compass.controllers.policy_handlers) only
does the I/O around them.

- ``compile_policy``: the spec as the operator uses it (plan, policy, endpoints), or a
  ``SpecError`` naming the field and the fix (a spec that can never work).
- ``decision_due``: the timer ticks every second; a decision is taken when intervalSeconds
  has passed.
- ``align_state``: the policy state to decide from, given what the router really serves: a
  restarted operator resumes the state saved in the status (hysteresis timers included), so it
  never flips the configuration on start; routing changed behind its back is adopted.
- ``health_conditions`` / ``merge_conditions``: Ready, MetricsAvailable, Degraded and Paused,
  with lastTransitionTime kept while a condition's status does not change.
- ``transition_events``: the Kubernetes Events to post, on transitions only.
- ``build_status`` / ``status_patch``: the status, and the merge patch that writes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from compass.api.conditions import (
    Condition,
    find_condition,
    parse_conditions,
    set_conditions,
)
from compass.api.errors import field_path, first_error
from compass.api.meta import GROUP
from compass.api.metricsource import MetricsAuthentication, MetricsSourceType
from compass.api.paretopolicy import (
    MAX_LAGGING_PODS,
    ActiveConfiguration,
    BlendStatus,
    ConditionType,
    LaggingPod,
    ParetoPolicySpec,
    ParetoPolicyStatus,
    RoutingStatus,
    RoutingTarget,
)
from compass.api.schema import without_empty_strings
from compass.controllers.targets import (
    TargetAccess,
    TargetRefusedError,
    resolve_host,
    resolve_url,
)
from compass.conversion import admission_table, runtime_policy, threshold_statuses
from compass.dataplane.triton import RoutingError, parse_routing_key, routing_key
from compass.domain.elastico import Observation, PolicyState, capacity_pressure
from compass.domain.evaluation import Config
from compass.domain.planner import Plan, PlanError
from compass.domain.strategy import Policy

# The kopf timer's period; intervalSeconds below it decide at every tick.
TICK_S = 1.0
# A status whose only change is the observation time is written at most this often: an idle
# policy should not write to etcd every second.
STATUS_HEARTBEAT_S = 10.0
# Retry delays while Triton is unreachable grow up to this, so a long outage costs few calls
# but a restarted Triton is found again within seconds.
MAX_RETRY_DELAY_S = 8.0
# A policy's gauges outlive the last tick of this process by this long: several of the longest
# gaps between two ticks of an acting process (a retry after failures), so that they never lapse
# while it acts, and go soon after peering pauses it or the fence holds it.
SERIES_TTL_S = max(30.0, 3 * MAX_RETRY_DELAY_S)
# Triton's default metrics port, used when the spec names no metrics URL.
TRITON_METRICS_PORT = 8002


class SpecError(ValueError):
    """The spec can never work (``reason`` InvalidSpec) or reaches what the operator's settings
    refuse (TargetNotAllowed): one line naming the field, what is wrong and the fix."""

    def __init__(self, field: str, what: str, fix: str, reason: str = "InvalidSpec") -> None:
        super().__init__(f"spec.{field}: {what}; {fix}")
        self.field, self.what, self.fix, self.reason = field, what, fix, reason


@dataclass(frozen=True)
class MetricsTarget:
    """Where the queue depth (and the arrivals counter) is read; a Triton source without a URL
    reads every pod's own /metrics."""

    type: MetricsSourceType
    url: str | None
    query: str | None
    arrivals_query: str | None
    age_query: str | None = None
    # Credentials, CA and headers (read from the Secret it names when the source is built).
    authentication: MetricsAuthentication | None = None


@dataclass(frozen=True)
class CompiledPolicy:
    """A validated spec with everything derived from it, for one generation.

    The routers are the ready pods behind ``service`` (on their ``grpc_port``), or the one
    Triton at ``grpc_address``.
    """

    generation: int | None
    spec: ParetoPolicySpec
    policy: Policy
    grpc_address: str | None
    router_model: str
    metrics: MetricsTarget
    service: str | None = None
    grpc_port: int | str = "grpc"
    metrics_port: int | str = "metrics"

    @property
    def plan(self) -> Plan:
        """The planned front and its thresholds."""
        return self.policy.plan

    @cached_property
    def admission(self) -> dict[str, Any] | None:
        """The table every router gets with each switch (None: admission off); built once a
        generation, not every tick."""
        return admission_table(self.spec, self.plan)


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def compile_policy(
    raw_spec: Mapping[str, Any], generation: int | None, address_override: str | None = None
) -> CompiledPolicy:
    """Validate the spec and derive the plan and the endpoints; SpecError if it cannot work."""
    try:
        spec = ParetoPolicySpec.model_validate(dict(raw_spec))
    except ValidationError as error:
        location, message = first_error(error)
        raise SpecError(
            field_path(location) or "front", message, "correct it and apply the policy again"
        ) from error
    try:
        policy = runtime_policy(spec)
    except PlanError as error:
        raise SpecError(error.field, error.what, error.fix) from error
    routing = spec.routing or RoutingTarget()
    # The address override (a development setting) wins over a Service.
    service = None if address_override else routing.service
    address, metrics_host = None, None
    if not service:
        address = address_override or routing.grpc_endpoint
        if not address:
            raise SpecError(
                "routing.service",
                "not set (nor routing.grpcEndpoint), so there is no router to switch",
                "name the Service of the Triton pods (routing.service: triton), or give one "
                "Triton's gRPC endpoint as routing.grpcEndpoint: host:port",
            )
        host_port = _host_port(address)
        if host_port is None:
            raise SpecError(
                "routing.grpcEndpoint", f"{address!r} is not host:port", "write it as triton:8001"
            )
        metrics_host = host_port[0]
    return CompiledPolicy(
        generation=generation,
        spec=spec,
        policy=policy,
        grpc_address=address,
        router_model=routing.router_model,
        metrics=_metrics_target(spec, metrics_host),
        service=service or None,
        grpc_port=routing.grpc_port,
        metrics_port=routing.metrics_port,
    )


def authorize_targets(
    compiled: CompiledPolicy,
    namespace: str,
    access: TargetAccess,
    address_override: str | None = None,
) -> CompiledPolicy:
    """The compiled policy with every host it reaches allowed by the operator's settings (a
    bare Service name read in the policy's namespace); SpecError (TargetNotAllowed) naming the
    field if one is not. The address override is the operator's own setting: not checked."""
    spec, address = compiled.spec, compiled.grpc_address
    try:
        metrics = compiled.metrics
        if address is not None and address != address_override:
            host, port = _host_port(address) or (address, 0)
            host = resolve_host(host, "routing.grpcEndpoint", namespace, access, router=True)
            address = f"{host}:{port}"
            # Triton's /metrics on the routing host, unless the spec names its own URL.
            metrics = _metrics_target(spec, host)
        if spec.metrics is not None and spec.metrics.url:
            url = resolve_url(spec.metrics.url, "metrics.url", namespace, access)
            metrics = replace(metrics, url=url)
    except TargetRefusedError as error:
        raise SpecError(error.field, error.what, error.fix, "TargetNotAllowed") from error
    return replace(compiled, grpc_address=address, metrics=metrics)


def _metrics_target(spec: ParetoPolicySpec, triton_host: str | None) -> MetricsTarget:
    """The spec's metrics source; none given means Triton's own /metrics: on the routing host,
    or (``triton_host`` None: a Service) on every pod."""
    source = spec.metrics
    if source is None or source.type is MetricsSourceType.TRITON:
        if source is not None and source.age_query:
            raise SpecError(
                "metrics.ageQuery",
                "set for a Triton metrics source, which has no PromQL (and is read fresh)",
                "remove it, or read the metrics through Prometheus (metrics.type: prometheus)",
            )
        if source is not None and source.arrivals_query:
            raise SpecError(
                "metrics.arrivalsQuery",
                "set for a Triton metrics source, which has no PromQL",
                "remove it, or read the metrics through Prometheus (metrics.type: prometheus)",
            )
        url = (source.url if source is not None else None) or (
            None if triton_host is None else f"http://{triton_host}:{TRITON_METRICS_PORT}/metrics"
        )
        auth = None if source is None else source.authentication
        return MetricsTarget(MetricsSourceType.TRITON, url, None, None, authentication=auth)
    if not source.url:
        raise SpecError(
            "metrics.url",
            "not set for a Prometheus source",
            "give Prometheus' base URL (e.g. http://prometheus.monitoring.svc:9090), or use "
            "metrics.type: triton to read Triton's /metrics directly",
        )
    return MetricsTarget(
        source.type,
        source.url,
        source.query,
        source.arrivals_query,
        source.age_query,
        source.authentication,
    )


def decision_due(
    last_tick: float | None, now: float, interval_s: float, tick_s: float = TICK_S
) -> bool:
    """Whether a decision is due: intervalSeconds since the last one, to half a tick."""
    return last_tick is None or now - last_tick >= interval_s - tick_s / 2


def retry_delay(failures: int, interval_s: float) -> float:
    """Delay before retrying after ``failures`` failed ticks in a row: doubling, capped."""
    base = max(interval_s, TICK_S)
    return float(min(MAX_RETRY_DELAY_S, base * 2 ** max(failures - 1, 0)))


def align_state(
    saved: PolicyState | None,
    last_observed: float | None,
    router_key: str,
    plan: Plan,
    now: float,
    stale_after_s: float,
) -> tuple[PolicyState, str | None]:
    """The state to decide from, given the configuration the router really serves.

    The saved state is kept, hysteresis timers included, when its active configuration is
    what the router serves; its downscale evidence is dropped if nothing was observed for
    longer than the staleness limit (the entry condition must hold at every observation, and
    there were none). Otherwise the router's configuration is adopted (counters kept); one
    not on the front gives no active configuration, so the policy falls back to the fastest.
    """
    serving = routing_names(plan, router_key)
    if saved is not None and saved.active is not None and _routed(saved) == serving:
        if last_observed is not None and now - last_observed <= stale_after_s:
            return saved, None
        dropped = saved.downscale_since is not None
        state = replace(saved, downscale_since=None, entry_levels=())
        return state, (
            "no observation for a while: downscale evidence restarts" if dropped else None
        )
    # Counters and the last switch (its time gates the upscale cooldown) are kept.
    base = saved or PolicyState()
    reset = replace(base, downscale_since=None, entry_levels=(), active_since=now)
    if serving is None:
        note = f"the router serves {router_key}, which is not on the front"
        return replace(reset, active=None, blend=None, weight=0.0), note
    active, blend, weight = serving
    adopted = replace(reset, active=active, blend=blend, weight=weight)
    if saved is None or saved.active is None:
        return adopted, None
    note = (
        f"the router serves {routing_label(adopted)}, not {routing_label(saved)}: adopted "
        "(changed outside the policy)"
    )
    return adopted, note


def routing_names(plan: Plan, router_key: str) -> tuple[str, str | None, float] | None:
    """What a router's routing key serves, as front member names; None if not on the front."""
    try:
        base, blend, weight = parse_routing_key(router_key)
    except RoutingError:
        return None
    names = {t.profile.key: t.profile.name for t in plan.thresholds}
    if base not in names or (blend is not None and blend not in names):
        return None
    return names[base], None if blend is None else names[blend], weight


def state_routing(plan: Plan, state: PolicyState) -> tuple[Config, Config | None, float] | None:
    """What a state routes, as a router switch takes it: (config, blend or None, weight)."""
    index = None if state.active is None else plan.index(state.active)
    if index is None:
        return None
    blend = None if state.blend is None else plan.index(state.blend)
    config = plan.thresholds[index].profile.config
    if blend is None:
        return config, None, 0.0
    return config, plan.thresholds[blend].profile.config, state.weight


def state_routing_key(plan: Plan, state: PolicyState) -> str | None:
    """The routing key of what a state routes (as the routers report it); None if unknown."""
    routing = state_routing(plan, state)
    return None if routing is None else routing_key(*routing)


def _routed(state: PolicyState) -> tuple[str | None, str | None, float]:
    return state.active, state.blend, state.weight if state.blend is not None else 0.0


# Holds a policy as spec.paused does, without touching the spec (KEDA's
# autoscaling.keda.sh/paused): a person or a tool pauses a policy that GitOps or a workflow owns.
PAUSE_ANNOTATION = f"{GROUP}/paused"
PAUSE_VALUES = ("true", "false")


@dataclass(frozen=True)
class Pause:
    """Whether a policy is held, why (a Paused condition reason), and a note for people."""

    paused: bool
    reason: str  # PausedBySpec, PausedByAnnotation, InvalidPauseAnnotation or Active
    message: str = ""


def pause_of(spec: ParetoPolicySpec, annotations: Mapping[str, str] | None) -> Pause:
    """Whether spec.paused or the PAUSE_ANNOTATION holds the policy; an annotation value other
    than "true" or "false" pauses nothing and says what to write."""
    value = (annotations or {}).get(PAUSE_ANNOTATION)
    if spec.paused:
        return Pause(True, "PausedBySpec", "spec.paused")
    if value is None or value == "false":
        return Pause(False, "Active")
    if value == "true":
        return Pause(True, "PausedByAnnotation", f"annotation {PAUSE_ANNOTATION}")
    return Pause(
        False,
        "InvalidPauseAnnotation",
        f"annotation {PAUSE_ANNOTATION}: {value[:64]!r} is not one of "
        f"{', '.join(repr(v) for v in PAUSE_VALUES)}; the policy is not paused",
    )


def paused_state(state: PolicyState) -> PolicyState:
    """While paused nothing is decided: no downscale evidence accumulates."""
    return replace(state, downscale_since=None, entry_levels=())


# ---------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class Health:
    """What one tick found, for the conditions."""

    spec_error: str | None = None
    spec_reason: str = "InvalidSpec"
    unreachable: str | None = None
    switch_failed: str | None = None
    metrics_error: str | None = None
    # The conditions' reason while the metrics cannot be read.
    metrics_reason: str = "MetricsUnavailable"
    metrics_read: bool = False
    metrics_source: str = ""
    pause: Pause = Pause(False, "Active")
    active: str | None = None
    decision: str = ""
    routing: RoutingStatus | None = None


def routing_status(
    pods: Sequence[tuple[str, str | None, str | None]], active: str
) -> RoutingStatus:
    """The pods a routing call reached, from (pod, configuration it serves, error) triples."""
    lagging = [
        LaggingPod(name=pod, reason=error or f"serves {config}")
        for pod, config, error in pods
        if config != active
    ]
    return RoutingStatus(
        pods=len(pods), serving=len(pods) - len(lagging), lagging=lagging[:MAX_LAGGING_PODS]
    )


def _pods_condition(routing: RoutingStatus, active: str | None) -> Condition:
    """PodsServing: every ready pod serves the active configuration, or which do not."""
    kind = ConditionType.PODS_SERVING.value
    if not routing.lagging:
        message = f"{routing.serving}/{routing.pods} pods serve {active}"
        return Condition(type=kind, status="True", reason="AllPodsServing", message=message)
    shown = ", ".join(f"{p.name} ({p.reason})" for p in routing.lagging)
    message = f"{routing.serving}/{routing.pods} pods serve {active}; lagging: {shown}"
    return Condition(type=kind, status="False", reason="PodsLagging", message=message)


def health_conditions(health: Health) -> list[Condition]:
    """Ready, MetricsAvailable (when the metrics were tried), Degraded, Paused and (when the
    pods were reached) PodsServing."""
    ready = ConditionType.READY.value
    if health.spec_error is not None:
        return [
            Condition(
                type=ready, status="False", reason=health.spec_reason, message=health.spec_error
            )
        ]
    problem: tuple[str, str] | None = None
    if health.unreachable is not None:
        problem = ("TritonUnreachable", f"{health.unreachable}; holding, retrying")
    elif health.switch_failed is not None:
        problem = ("SwitchFailed", health.switch_failed)
    elif health.metrics_error is not None:
        problem = (health.metrics_reason, f"{health.metrics_error}; {health.decision}")
    conditions = []
    if problem is not None:
        reason, message = problem
        conditions.append(Condition(type=ready, status="False", reason=reason, message=message))
    else:
        serving = f"serving {health.active}" if health.active else "no active configuration"
        conditions.append(
            Condition(
                type=ready,
                status="True",
                reason="Paused" if health.pause.paused else "Serving",
                message=f"{serving}; {health.decision}" if health.decision else serving,
            )
        )
    if health.metrics_read:
        available = health.metrics_error is None
        conditions.append(
            Condition(
                type=ConditionType.METRICS_AVAILABLE.value,
                status="True" if available else "False",
                reason="MetricsRead" if available else health.metrics_reason,
                message=f"queue depth from {health.metrics_source}"
                if available
                else str(health.metrics_error),
            )
        )
    conditions.append(
        Condition(
            type=ConditionType.DEGRADED.value,
            status="False" if problem is None else "True",
            reason="AsPlanned" if problem is None else problem[0],
            message="" if problem is None else problem[1],
        )
    )
    pause = health.pause
    conditions.append(
        Condition(
            type=ConditionType.PAUSED.value,
            status="True" if pause.paused else "False",
            reason=pause.reason,
            message=f"{pause.message}: holding {health.active}" if pause.paused else pause.message,
        )
    )
    if health.routing is not None:
        conditions.append(_pods_condition(health.routing, health.active))
    return conditions


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    updates: Sequence[Condition],
    now_iso: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The new condition list (camelCase): updated ones replace theirs (keeping
    lastTransitionTime while their status is unchanged), the others stay as they were; in
    ConditionType order, unknown types last."""
    stamped = [u.model_copy(update={"observed_generation": generation}) for u in updates]
    merged = set_conditions(parse_conditions(previous), stamped, now_iso)
    order = [t.value for t in ConditionType]
    merged.sort(key=lambda c: (order.index(c.type) if c.type in order else len(order), c.type))
    return [c.model_dump(by_alias=True, mode="json") for c in merged]


def is_ready(conditions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the condition Ready is True (the policy is in control of the routing)."""
    ready = find_condition(parse_conditions(conditions), ConditionType.READY)
    return ready is not None and ready.status == "True"


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the ParetoPolicy."""

    type: str
    reason: str
    message: str


def routing_label(state: PolicyState) -> str | None:
    """What a state routes, as people read it: a member, or a member with a share of another."""
    if state.active is None or state.blend is None:
        return state.active
    return f"{state.active} + {state.weight:.0%} {state.blend}"


def switch_event(
    previous: str | None, target: str, queue_depth: float | None, reason: str
) -> Event:
    """ConfigurationSwitched: from -> to, the queue depth and why, on one line."""
    depth = "unknown" if queue_depth is None else f"{queue_depth:g}"
    message = f"{previous or 'none'} -> {target}: queue {depth}; {reason}"
    return Event("Normal", "ConfigurationSwitched", message)


def transition_events(
    previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
) -> list[Event]:
    """Events for conditions that changed: metrics lost or restored, Triton unreachable or
    reachable again, a switch failing; nothing while a state persists."""
    events = []
    before, after = parse_conditions(previous), parse_conditions(current)
    old_metrics = find_condition(before, ConditionType.METRICS_AVAILABLE)
    new_metrics = find_condition(after, ConditionType.METRICS_AVAILABLE)
    old_metrics_status = None if old_metrics is None else old_metrics.status
    if new_metrics is not None:
        if new_metrics.status == "False" and old_metrics_status != "False":
            events.append(Event("Warning", "MetricsLost", new_metrics.message))
        elif new_metrics.status == "True" and old_metrics_status == "False":
            events.append(Event("Normal", "MetricsRestored", new_metrics.message))
    old_ready = find_condition(before, ConditionType.READY)
    new_ready = find_condition(after, ConditionType.READY)
    old_reason = None if old_ready is None else old_ready.reason
    loud = ("TritonUnreachable", "SwitchFailed", "InvalidSpec", "TargetNotAllowed")
    if new_ready is not None:
        if new_ready.reason in loud and new_ready.reason != old_reason:
            events.append(Event("Warning", new_ready.reason, new_ready.message))
        elif old_reason == "TritonUnreachable" and new_ready.status == "True":
            events.append(Event("Normal", "TritonReachable", new_ready.message))
    old_pause = find_condition(before, ConditionType.PAUSED)
    new_pause = find_condition(after, ConditionType.PAUSED)
    invalid = "InvalidPauseAnnotation"
    fresh = old_pause is None or old_pause.reason != invalid
    if new_pause is not None and new_pause.reason == invalid and fresh:
        events.append(Event("Warning", invalid, new_pause.message))
    old_pods = find_condition(before, ConditionType.PODS_SERVING)
    new_pods = find_condition(after, ConditionType.PODS_SERVING)
    if new_pods is not None and new_pods.status == "False":
        # A new lagging set names its pods again; the same set persisting posts nothing.
        if old_pods is None or old_pods.status != "False" or old_pods.message != new_pods.message:
            events.append(Event("Warning", "PodsLagging", new_pods.message))
    elif new_pods is not None and old_pods is not None and old_pods.status == "False":
        events.append(Event("Normal", "PodsServing", new_pods.message))
    return events


# ---------------------------------------------------------------------------- status


def rfc3339(seconds: float) -> str:
    """Epoch seconds as RFC 3339 UTC with milliseconds."""
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def parse_rfc3339(value: object) -> float | None:
    """RFC 3339 back to epoch seconds; None if absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def active_configuration(
    plan: Plan, name: str | None, blend: str | None = None, weight: float = 0.0
) -> ActiveConfiguration | None:
    """The front member with this name as the status shows it, with its blend if any."""
    index = None if name is None else plan.index(name)
    if index is None:
        return None
    blend_index = None if blend is None else plan.index(blend)
    blended = (
        None
        if blend is None or blend_index is None or not 0 < weight < 1
        else BlendStatus(name=blend, index=blend_index, weight=round(weight, 4))
    )
    profile = plan.thresholds[index].profile
    # Rounded for people (kubectl's printer columns print every digit); the spec keeps them all.
    return ActiveConfiguration(
        name=profile.name,
        config=dict(profile.config),
        index=index,
        accuracy=round(profile.accuracy, 4),
        latency_mean_ms=round(profile.mean_ms, 1),
        latency_p95_ms=round(profile.p95_ms, 1),
        blend=blended,
    )


@dataclass(frozen=True)
class PolicyGauges:
    """What the per-policy gauges show after one tick (None: leave that series as it is, but
    for the capacity pressure, whose series None removes)."""

    ready: bool
    paused: bool | None = None
    metrics_available: bool | None = None
    queue_depth: float | None = None
    # The active entry: position, name, accuracy served, queue thresholds; None: none known.
    active_index: int | None = None
    active_name: str | None = None
    at_fastest: bool | None = None
    served_accuracy: float | None = None
    stay_queue_threshold: float | None = None
    enter_queue_threshold: float | None = None
    # None while the queue is not known fresh: no figure, so that an autoscaler holds its
    # replicas (its query errs) instead of acting on a stale one.
    capacity_pressure: float | None = None


def policy_gauges(
    plan: Plan,
    state: PolicyState,
    observation: Observation | None,
    conditions: Sequence[Mapping[str, Any]],
    paused: bool,
) -> PolicyGauges:
    """The policy's gauges after a decision: the active entry, what it serves and its limits,
    and the capacity pressure on the queue just observed (none unless it is fresh)."""
    metrics = find_condition(parse_conditions(conditions), ConditionType.METRICS_AVAILABLE)
    fresh = metrics is not None and metrics.status == "True"
    index = None if state.active is None else plan.index(state.active)
    depth = None if observation is None else observation.queue_depth
    pressure = None
    if fresh and depth is not None:
        pressure = capacity_pressure(plan, state.active, depth)
    gauges = PolicyGauges(
        ready=is_ready(conditions),
        paused=paused,
        metrics_available=None if metrics is None else fresh,
        queue_depth=depth,
        capacity_pressure=pressure,
    )
    if index is None:
        return gauges
    threshold = plan.thresholds[index]
    accuracy = threshold.profile.accuracy
    blend = None if state.blend is None else plan.index(state.blend)
    if blend is not None and 0 < state.weight < 1:
        share = state.weight
        accuracy = (1 - share) * accuracy + share * plan.thresholds[blend].profile.accuracy
    eligible = plan.eligible
    return replace(
        gauges,
        active_index=index,
        active_name=threshold.profile.name,
        at_fastest=bool(eligible) and index == eligible[0],
        served_accuracy=accuracy,
        stay_queue_threshold=_limit(threshold.stay_max_queue),
        enter_queue_threshold=_limit(threshold.enter_max_queue),
    )


def _limit(queue: int | None) -> float:
    """A queue limit as a gauge: none means no queue at all is allowed (0)."""
    return 0.0 if queue is None else float(queue)


def build_status(
    plan: Plan,
    state: PolicyState,
    observation: Observation | None,
    previous: Mapping[str, Any],
    decision: str,
    conditions: list[dict[str, Any]],
    generation: int | None,
    routing: RoutingStatus | None = None,
) -> dict[str, Any]:
    """The whole status (camelCase, JSON-ready); unobserved fields keep their previous values."""
    depth = observation.queue_depth if observation is not None else previous.get("lastQueueDepth")
    observed = (
        rfc3339(observation.time)
        if observation is not None
        else previous.get("lastObservationTime")
    )
    status = ParetoPolicyStatus(
        active=active_configuration(plan, state.active, state.blend, state.weight),
        last_queue_depth=None if depth is None or not math.isfinite(depth) else float(depth),
        last_observation_time=observed,
        last_decision=decision,
        last_switch_time=None if state.last_switch_at is None else rfc3339(state.last_switch_at),
        last_switch_reason=state.last_reason if state.last_switch_at is not None else None,
        switches=state.switches,
        routing=routing,
        thresholds=threshold_statuses(plan),
        policy_state=state.to_dict(),
        observed_generation=generation,
    )
    data = status.model_dump(by_alias=True, mode="json")
    data["conditions"] = conditions
    return dict(without_empty_strings(data))


def error_status(
    previous: Mapping[str, Any], conditions: list[dict[str, Any]], generation: int | None
) -> dict[str, Any]:
    """The previous status with new conditions: what a tick that could not decide writes."""
    return dict(
        without_empty_strings(
            {**previous, "conditions": conditions, "observedGeneration": generation}
        )
    )


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: changed keys, nested
    objects recursively, removed keys as null; empty when nothing changed."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif (key not in old and value is not None) or (key in old and before != value):
            patch[key] = value
    return patch


def _condition_states(conditions: Any) -> list[tuple[Any, ...]] | None:
    """Each condition's type, status and reason: what a condition says, less its wording."""
    if not isinstance(conditions, list):
        return None
    return [
        (c.get("type"), c.get("status"), c.get("reason")) if isinstance(c, Mapping) else (c,)
        for c in conditions
    ]


def status_patch(
    previous: Mapping[str, Any],
    new: Mapping[str, Any],
    now: float,
    last_write: float | None,
    heartbeat_s: float = STATUS_HEARTBEAT_S,
) -> dict[str, Any]:
    """What to write to the status: the changes, except routine ones (the observation time, the
    arrivals samples, and the wording of the last decision and of conditions whose status and
    reason stay), which wait for the heartbeat: an idle policy should not write every second
    (the predictive strategy's reason quotes a rate that moves every tick). A restart then
    loses at most a heartbeat of arrivals samples (rate evidence)."""
    patch = merge_patch(previous, new)
    state = patch.get("policyState")
    quiet = (
        set(patch) <= {"lastObservationTime", "lastDecision", "policyState", "conditions"}
        and (
            state is None
            or (isinstance(state, Mapping) and set(state) <= {"arrivals", "observed_at"})
        )
        and (
            "conditions" not in patch
            or _condition_states(previous.get("conditions"))
            == _condition_states(new.get("conditions"))
        )
    )
    if quiet and last_write is not None and now - last_write < heartbeat_s:
        return {}
    return patch
