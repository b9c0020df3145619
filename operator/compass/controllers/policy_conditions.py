"""A ParetoPolicy's conditions, and the Events posted on their transitions only."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compass.api.conditions import Condition
from compass.api.paretopolicy_status import (
    MAX_LAGGING_PODS,
    ConditionType,
    LaggingPod,
    RoutingStatus,
)
from compass.controllers.conditions import (
    Event,
    find_condition,
    parse_conditions,
    set_conditions,
)
from compass.controllers.policy_decisions import NOT_PAUSED, Pause
from compass.dataplane.triton import RouterState


@dataclass(frozen=True)
class Health:
    """What one tick found, for the conditions."""

    spec_error: str | None = None
    spec_reason: str = "InvalidSpec"
    # An older policy acts on the same target: this one switches nothing.
    claimed_by: str | None = None
    unreachable: str | None = None
    switch_failed: str | None = None
    metrics_error: str | None = None
    # The conditions' reason while the metrics cannot be read.
    metrics_reason: str = "MetricsUnavailable"
    metrics_read: bool = False
    metrics_source: str = ""
    pause: Pause = NOT_PAUSED
    active: str | None = None
    decision: str = ""
    routing: RoutingStatus | None = None
    # Per-request binding: whether the pods' routers bind each request (None: not asked).
    binding: Condition | None = None
    # Advisory mode: what the routers serve, untouched (None: the policy acts).
    advisory_routing: str | None = None


def binding_condition(
    reported: Mapping[str, RouterState],
    strategy: str,
    modelled: tuple[int, int],
    per_request: bool = True,
) -> Condition | None:
    """PerRequestBinding from what each pod's router reported (None: no pod reported)."""
    kind = ConditionType.PER_REQUEST_BINDING.value
    unbound = functools.partial(Condition, type=kind, status="False")
    if not per_request:
        return unbound(
            reason="WholeWorkflow",
            message=f"binding.mode workflow: {strategy} switches the whole workflow",
        )
    if not reported:
        return None
    old = sorted(pod for pod, state in reported.items() if not state.binds)
    if old:
        return unbound(
            reason="RoutersDoNotBind",
            message=f"{_pods(old)} run a router that does not bind per request (an older "
            f"image?): {strategy} serves the whole workflow there; update the router image",
        )
    ungated = sorted(pod for pod, state in reported.items() if state.gate is None)
    if ungated:
        return unbound(
            reason="RoutersNotGated",
            message=f"{_pods(ungated)} have no gate (compass_pipeline_slots): they bind only "
            f"requests that carry compass_deadline_ns, and {strategy} serves the rest; run the "
            "router's gated config (8 instances, 1 slot)",
        )
    instances, slots = modelled
    # A router of other slots judges each request at a concurrency the plan did not model.
    run_by_pod = {pod: state.gate[1] for pod, state in reported.items() if state.gate is not None}
    differ = sorted(pod for pod, run_slots in run_by_pod.items() if run_slots != slots)
    if differ:
        run = sorted({run_by_pod[pod] for pod in differ})
        return unbound(
            reason="GateSlotsDiffer",
            message=f"{_pods(differ)} run {' or '.join(map(str, run))} pipeline slot(s) where "
            f"the plan binds at {slots}: run the router with compass_pipeline_slots {slots} and "
            f"{instances} instances, or set binding.gate.slots to what the routers run",
        )
    gates = sorted({state.gate for state in reported.values() if state.gate is not None})
    shown = ", ".join(f"{i} instances and {g} slot(s)" for i, g in gates)
    message = f"{len(reported)}/{len(reported)} pods bind each request behind a gate of {shown}"
    if gates != [modelled]:
        message += (
            f"; the plan models {modelled[0]} instances and {modelled[1]} slot(s): set "
            "binding.gate to what the routers run"
        )
    return Condition(type=kind, status="True", reason="BindingPerRequest", message=message)


def _pods(pods: Sequence[str]) -> str:
    """A few pod names for a message, and how many more."""
    shown = ", ".join(pods[:MAX_LAGGING_PODS])
    more = len(pods) - MAX_LAGGING_PODS
    return f"pods {shown}" + (f" and {more} more" if more > 0 else "")


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
    """Ready, MetricsAvailable (metrics tried), Degraded, Paused, PodsServing (pods reached)."""
    ready = ConditionType.READY.value
    if health.spec_error is not None:
        return [
            Condition(
                type=ready, status="False", reason=health.spec_reason, message=health.spec_error
            )
        ]
    problem: tuple[str, str] | None = None
    if health.claimed_by is not None:
        problem = (
            "TargetClaimed",
            f"ParetoPolicy {health.claimed_by} (older) acts on the same routing target: this "
            "one switches nothing while it does; delete one of them",
        )
    elif health.unreachable is not None:
        problem = ("TritonUnreachable", f"{health.unreachable}; holding, retrying")
    elif health.switch_failed is not None:
        problem = ("SwitchFailed", health.switch_failed)
    elif health.metrics_error is not None:
        problem = (health.metrics_reason, f"{health.metrics_error}; {health.decision}")
    decided = f"; {health.decision}" if health.decision else ""
    if problem is not None:
        reason, message = problem
        conditions = [Condition(type=ready, status="False", reason=reason, message=message)]
    elif health.advisory_routing is not None:
        would = f"would serve {health.active}" if health.active else "no configuration"
        said = f"advisory: {would}, the routers serve {health.advisory_routing} (untouched)"
        advising = Condition(type=ready, status="True", reason="Advisory", message=said + decided)
        conditions = [advising]
    else:
        said = f"serving {health.active}" if health.active else "no active configuration"
        serving = Condition(
            type=ready,
            status="True",
            reason="Paused" if health.pause.paused else "Serving",
            message=said + decided,
        )
        conditions = [serving]
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
    if health.binding is not None:
        conditions.append(health.binding)
    return conditions


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    updates: Sequence[Condition],
    now_iso: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The new condition list (camelCase): ``updates`` set, in ConditionType order."""
    stamped = [u.model_copy(update={"observed_generation": generation}) for u in updates]
    merged = set_conditions(parse_conditions(previous), stamped, now_iso)
    order = [t.value for t in ConditionType]
    merged.sort(key=lambda c: (order.index(c.type) if c.type in order else len(order), c.type))
    return [c.model_dump(by_alias=True, mode="json") for c in merged]


def is_ready(conditions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the condition Ready is True (the policy is in control of the routing)."""
    ready = find_condition(parse_conditions(conditions), ConditionType.READY)
    return ready is not None and ready.status == "True"


# Refused slice addresses named in a message (an Event, the Ready condition): the first few.
MAX_REFUSED_SHOWN = 5


def refused_endpoints(service: str, namespace: str, refused: Sequence[str]) -> str:
    """Which addresses of a Service's EndpointSlices are not its namespace's Pods, on one line."""
    shown = "; ".join(refused[:MAX_REFUSED_SHOWN])
    more = (
        f" (and {len(refused) - MAX_REFUSED_SHOWN} more)"
        if len(refused) > MAX_REFUSED_SHOWN
        else ""
    )
    return (
        f"Service {service}: {len(refused)} address(es) of its EndpointSlices are not Pods of "
        f"namespace {namespace}, neither switched nor scraped: {shown}{more}"
    )


def refused_event(service: str, namespace: str, refused: Sequence[str]) -> Event:
    """EndpointsRefused: the slice addresses left out (posted when they change)."""
    return Event("Warning", "EndpointsRefused", refused_endpoints(service, namespace, refused))


def switch_event(
    previous: str | None,
    target: str,
    queue_depth: float | None,
    reason: str,
    advisory: bool = False,
) -> Event:
    """ConfigurationSwitched (advisory: WouldSwitch): from -> to, the queue depth and why."""
    depth = "unknown" if queue_depth is None else f"{queue_depth:g}"
    message = f"{previous or 'none'} -> {target}: queue {depth}; {reason}"
    return Event("Normal", "WouldSwitch" if advisory else "ConfigurationSwitched", message)


def transition_events(
    previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
) -> list[Event]:
    """Events for the conditions that changed (metrics, Triton, switch, pause, pods)."""
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
