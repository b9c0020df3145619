"""A ParetoPolicy's status, gauges and Events as its ticks publish them, and their memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import kopf
from kubernetes import client

from compass.api.meta import GROUP, POLICY_KIND, POLICY_PLURAL, VERSION
from compass.controllers import kubeapi
from compass.controllers.policy_compile import CompiledPolicy
from compass.controllers.policy_conditions import (
    Health,
    health_conditions,
    is_ready,
    merge_conditions,
    transition_events,
)
from compass.controllers.policy_connections import Connections
from compass.controllers.policy_status import (
    STATUS_HEARTBEAT_S,
    PolicyGauges,
    build_status,
    error_status,
    heartbeat_due,
    owned_fields,
    policy_gauges,
    rfc3339,
    served_status,
    status_patch,
    too_large,
    too_large_patch,
    with_stream_times,
)
from compass.controllers.runtime import Runtime
from compass.domain.policy import Observation, PolicyState
from compass.domain.served import SERVED_WINDOW_S

# How many writes before the last a late body may still show (see PolicyMemory.recent).
RECENT_WRITES = 4


@dataclass
class PolicyMemory:
    """What the ticks remember about one policy during one operator run (kopf's memo)."""

    compiled: CompiledPolicy | None = None
    reported_error: tuple[int | None, str] | None = None
    connections: Connections | None = None
    state: PolicyState | None = None
    # The status as last decided, and as last written (None: unknown, use the live body's).
    status: dict[str, Any] | None = None
    written: dict[str, Any] | None = None
    # owned_fields of the writes before the last: a body the watch delivers late still shows one.
    recent: list[dict[str, Any]] = field(default_factory=list)
    last_tick: float | None = None
    last_write: float | None = None
    last_observed: float | None = None
    failures: int = 0
    fenced: bool = False
    # The last tick was advisory: the next decides from the policy's own state, not from the
    # routers' (see policy_handlers).
    advised: bool = False
    # The Service's slice addresses last refused (not the namespace's Pods'), reported on change.
    refused: tuple[str, ...] = ()
    # Routine status writes: at most one a heartbeat, in this policy's slot of it (so that a
    # thousand policies spread their writes over the heartbeat).
    heartbeat_s: float = STATUS_HEARTBEAT_S
    phase_s: float | None = None
    # The condition updates of the last tick and its generation: the same again merge to the
    # same list (merging them is a third of a steady tick's CPU).
    condition_updates: tuple[Any, ...] | None = None
    # _quiet_key of the last tick whose status, worked out, had nothing to write.
    quiet: tuple[Any, ...] | None = None
    # The last tick's health, its generation and their condition updates (_condition_updates).
    health: tuple[Health, int | None, tuple[Any, ...]] | None = None
    # The quiet ticks' gauges: (conditions, what else they depend on, the gauges).
    gauges: tuple[Sequence[Mapping[str, Any]], tuple[Any, ...], PolicyGauges] | None = None
    # status.served as last made, and when the routers' counts were last asked for.
    served: dict[str, Any] | None = None
    served_read_at: float | None = None


def publish(
    body: kopf.Body,
    memory: PolicyMemory,
    runtime: Runtime,
    logger: kopf.Logger,
    previous: dict[str, Any],
    health: Health,
    decided: tuple[CompiledPolicy, PolicyState, Observation | None] | None,
    now: float,
    generation: int | None,
) -> None:
    """Write the status (when it changed), post the transition Events, set the gauges."""
    old_conditions = previous.get("conditions") or []
    updates = _condition_updates(memory, health, generation)
    # What the conditions say is what they said last tick: the same list (no transition).
    same = memory.status is not None and memory.condition_updates == updates
    # Or only their wording moved (the predictive strategy's Ready message quotes a rate that
    # moves with every look): a routine change, which status_patch holds for the heartbeat.
    reworded = (
        not same
        and memory.status is not None
        and memory.condition_updates is not None
        and _condition_kinds(memory.condition_updates) == _condition_kinds(updates)
    )
    namespace, name = names_of(body)
    uid = str(body.get("metadata", {}).get("uid", ""))
    quiet = None
    if decided is not None and (same or reworded):
        compiled, state, observation = decided
        quiet = _quiet_key(body, compiled, state, health, generation)
        if quiet == memory.quiet and not heartbeat_due(
            now, memory.last_write, memory.heartbeat_s, memory.phase_s
        ):
            # Only routine fields can differ from the last status worked out, which wrote
            # nothing, and the heartbeat is not due: nothing to write or merge, only the gauges.
            gauges = _quiet_gauges(
                memory, compiled, state, observation, old_conditions, health.pause.paused
            )
            gauges = with_stream_times(gauges, memory.served)
            runtime.metrics.set_policy(namespace, name, uid, gauges)
            return
    if same:
        conditions = old_conditions
    else:
        conditions = merge_conditions(old_conditions, updates[0], rfc3339(now), generation)
        memory.condition_updates = updates
    if decided is None:
        status = error_status(previous, conditions, generation)
        # A spec that does not compile says nothing of paused; Triton unreachable does.
        paused = None if health.spec_error is not None else health.pause.paused
        gauges = PolicyGauges(ready=is_ready(conditions), paused=paused)
    else:
        compiled, state, observation = decided
        gauges = policy_gauges(compiled.plan, state, observation, conditions, health.pause.paused)
        status = build_status(
            compiled.plan,
            state,
            observation,
            previous,
            health.decision,
            conditions,
            generation,
            health.routing,
            _served(memory, compiled, now, logger, observation is not None),
        )
    # As status.served shows them (kept through a tick that reads none, as it is).
    gauges = with_stream_times(gauges, memory.served)
    runtime.metrics.set_policy(namespace, name, uid, gauges)
    written = memory.written if memory.written is not None else dict(body.get("status") or {})
    # The live status too: what someone else wrote over the operator's own fields is put back.
    live = body.get("status")
    changes = status_patch(
        written,
        status,
        now,
        memory.last_write,
        memory.heartbeat_s,
        live=live if isinstance(live, dict) else None,
        recent=memory.recent,
        phase_s=memory.phase_s,
    )
    memory.quiet = None if changes else quiet
    if changes:
        if _write_status(runtime, body, changes, logger, status.get("conditions") or [], now):
            memory.recent = [owned_fields(written), *memory.recent][:RECENT_WRITES]
            memory.written, memory.last_write = status, now
        else:
            memory.written = None  # compare with the live body next time
    memory.status = status
    if conditions is old_conditions:
        return
    for event in transition_events(old_conditions, conditions):
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _served(
    memory: PolicyMemory,
    compiled: CompiledPolicy,
    now: float,
    logger: kopf.Logger,
    observed: bool,
) -> dict[str, Any] | None:
    """status.served, asked of the metrics source at most once a heartbeat and only on a tick that
    read the queue; None while unknown (the status keeps what it showed)."""
    connections = memory.connections
    source = None if connections is None else connections.source
    due = memory.served_read_at is None or now - memory.served_read_at >= STATUS_HEARTBEAT_S
    if not due or not observed or source is None:
        return memory.served
    memory.served_read_at = now
    try:
        counts = source.served(SERVED_WINDOW_S)
        if counts is not None:
            memory.served = served_status(counts, compiled.plan, now)
    except Exception as error:  # the view only: never the decision, the status or the Events
        logger.warning(f"what the routers served could not be read: {error}")
    return memory.served


def _condition_updates(
    memory: PolicyMemory, health: Health, generation: int | None
) -> tuple[Any, ...]:
    """health_conditions of the tick: the last tick's object again when its health was the same."""
    last = memory.health
    if last is not None and last[0] == health and last[1] == generation:
        return last[2]
    updates = (tuple(health_conditions(health)), generation)
    memory.health = (health, generation, updates)
    return updates


def _quiet_gauges(
    memory: PolicyMemory,
    compiled: CompiledPolicy,
    state: PolicyState,
    observation: Observation | None,
    conditions: Sequence[Mapping[str, Any]],
    paused: bool,
) -> PolicyGauges:
    """policy_gauges of a quiet tick, worked out again only when what they show moved."""
    depth = None if observation is None else observation.queue_depth
    key = (compiled.plan, state.active, state.blend, state.weight, depth, paused)
    last = memory.gauges
    if last is not None and last[0] is conditions and last[1] == key:
        return last[2]
    gauges = policy_gauges(compiled.plan, state, observation, conditions, paused)
    memory.gauges = (conditions, key, gauges)
    return gauges


def _condition_kinds(updates: tuple[Any, ...]) -> tuple[Any, ...]:
    """Condition updates (and their generation) less their wording: type, status and reason."""
    conditions, generation = updates
    return (tuple((c.type, c.status, c.reason) for c in conditions), generation)


def _quiet_key(
    body: kopf.Body,
    compiled: CompiledPolicy,
    state: PolicyState,
    health: Health,
    generation: int | None,
) -> tuple[Any, ...]:
    """What of a tick's status is written at once on change, and the resourceVersion (an edit)."""
    routine = replace(state, arrivals=(), observed_at=None)
    # The queue depth seen is routine too (it moves every tick under load): not in the key.
    version = body.get("metadata", {}).get("resourceVersion")
    return (id(compiled.plan), generation, version, routine, health.routing)


def _write_status(
    runtime: Runtime,
    body: kopf.Body,
    changes: dict[str, Any],
    logger: kopf.Logger,
    conditions: Sequence[Mapping[str, Any]] = (),
    now: float = 0.0,
) -> bool:
    """Merge-patch the status; False (logged, counted) if it failed; refused for its size, the
    small too_large_patch instead. Not kopf's patch: its timer ends for good on a rejected one."""
    namespace, name = names_of(body)
    custom = client.CustomObjectsApi(runtime.api())

    def patch(status: Mapping[str, Any]) -> bool:
        return kubeapi.patch_status(
            custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            POLICY_PLURAL,
            name,
            body={"status": status},
        )

    try:
        return patch(changes)  # False: deleted meanwhile, nothing to report
    except kubeapi.ERRORS as error:
        logger.warning(f"status not written: {kubeapi.describe(error)}")
        runtime.metrics.errors.labels(POLICY_KIND, "StatusWriteFailed").inc()
        code = getattr(error, "status", None)
        if not too_large(code, kubeapi.describe(error)):
            return False
    generation = body.get("metadata", {}).get("generation")
    why = f"HTTP {code}: it is too large"
    try:
        patch(too_large_patch(conditions, generation, why, now))
    except kubeapi.ERRORS as error:
        logger.warning(f"the small status not written either: {kubeapi.describe(error)}")
    return False


def names_of(body: kopf.Body) -> tuple[str, str]:
    """The object's namespace and name."""
    metadata = body.get("metadata", {})
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))
