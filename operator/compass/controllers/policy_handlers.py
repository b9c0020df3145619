"""kopf handlers of ParetoPolicy (the I/O): a daemon per policy, ticking on one scheduler."""

from __future__ import annotations

import contextvars
import math
import time
from dataclasses import dataclass
from typing import Any

import kopf

from compass.api.meta import GROUP, POLICY_KIND, POLICY_PLURAL, VERSION
from compass.api.paretopolicy import PolicyMode
from compass.api.paretopolicy_status import RoutingStatus
from compass.controllers import metricsauth
from compass.controllers.claims import OldestClaims
from compass.controllers.endpoints import (
    SERVICE_NAME_LABEL,
    PortError,
    SliceEntry,
    admitted,
    pod_addresses,
    ready_endpoints,
    slice_entries,
)
from compass.controllers.policy_compile import (
    CompiledPolicy,
    SpecError,
    authorize_policy_targets,
    compile_policy,
)
from compass.controllers.policy_conditions import (
    Health,
    binding_condition,
    refused_endpoints,
    refused_event,
    routing_status,
    switch_event,
)
from compass.controllers.policy_connections import Connections, connect, routing_tls
from compass.controllers.policy_decisions import (
    SERIES_TTL_S,
    TICK_S,
    Claim,
    Pause,
    align_state,
    claim_keys,
    claim_of,
    claimant,
    decision_due,
    pause_of,
    paused_state,
    retry_delay,
    routing_label,
    routing_names,
    saved_state,
    state_routing,
    state_routing_key,
    target_key,
)
from compass.controllers.policy_publish import PolicyMemory, names_of, publish
from compass.controllers.policy_status import (
    heartbeat_phase,
    parse_rfc3339,
)
from compass.controllers.runtime import Runtime, runtime_of
from compass.controllers.targets import TargetAccess
from compass.dataplane.actuator import Actuator
from compass.dataplane.fleet import Endpoint, FleetSwitch
from compass.dataplane.live import LiveLoop
from compass.dataplane.triton import RoutingError, SwitchReport, routing_key
from compass.domain.evaluation import Config
from compass.domain.policy import Observation, PolicyState

MEMORY_KEY = "compass_policy"
# An unexpected exception (a bug) is retried after this; TemporaryError brings its own delay.
ERROR_BACKOFF_S = 5.0
# A daemon only waits: stopped, it ends at once.
CANCEL_S = 5.0
SlicesIndex = kopf.Index[tuple[str, str], tuple[SliceEntry, ...]]
PodsIndex = kopf.Index[tuple[str, str], str]
ClaimsIndex = kopf.Index[tuple[str, str, str], Claim]


@dataclass
class ObservingLoop(LiveLoop):
    """LiveLoop that remembers why its last observation failed or was stale (for the conditions)."""

    stale_after_s: float = math.inf
    metrics_problem: str | None = None

    def observe(self, now: float) -> tuple[Observation | None, str | None]:
        """The queue depth and arrivals counter, as LiveLoop reads them."""
        observation, problem = super().observe(now)
        self.metrics_problem = problem if observation is None else None
        if observation is not None and now - observation.time > self.stale_after_s:
            # Read, but its samples stopped moving: to the policy that is no observation.
            self.metrics_problem = (
                f"metrics stale: the samples are {now - observation.time:.1f} s old "
                f"(staleAfterSeconds {self.stale_after_s:g})"
            )
        return observation, problem


@kopf.index("discovery.k8s.io", "endpointslices", labels={SERVICE_NAME_LABEL: kopf.PRESENT})
def triton_slices(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], tuple[SliceEntry, ...]]:
    """Every Service's EndpointSlices by (namespace, Service); versionless: the cluster's choice."""
    return {(namespace or "", labels[SERVICE_NAME_LABEL]): slice_entries(body)}


@kopf.index("", "v1", "pods")
def triton_pods(
    namespace: str | None, name: str | None, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], str]:
    """Every Pod's IPs by (namespace, IP): whose a slice's address really is (a slice may lie)."""
    return {(namespace or "", ip): name or "" for ip in pod_addresses(body)}


@kopf.index(GROUP, VERSION, POLICY_PLURAL)
def policy_claims(
    namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> dict[tuple[str, str, str], Claim]:
    """Every policy's claim by routing target (one key however spelled): the oldest acts."""
    runtime = runtime_of(memo)
    key = target_key(namespace or "", body.get("spec") or {}, runtime.settings.target_access())
    claim = claim_of(body)
    runtime.oldest_claims.noted(names_of(body), key, claim)
    return {} if key is None or claim is None else {key: claim}


@kopf.daemon(GROUP, VERSION, POLICY_PLURAL, id="elastico", cancellation_timeout=CANCEL_S)
async def elastico_daemon(
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    **kwargs: Any,
) -> None:
    """The policy on this process's scheduler while kopf runs its daemon (until deleted or
    paused); ``body`` and the indexes are kopf's live views, read as they are at each tick."""
    runtime = runtime_of(memo)
    memory = memo.get(MEMORY_KEY)
    if not isinstance(memory, PolicyMemory):
        memory = memo[MEMORY_KEY] = PolicyMemory()
    indexes = Indexes(kwargs["triton_slices"], kwargs["triton_pods"], kwargs["policy_claims"])
    # kopf's context (its Event queue, its settings) for kopf.event in the scheduler's threads.
    context = contextvars.copy_context()
    namespace, name = names_of(body)
    key = (namespace, name, str(body.get("metadata", {}).get("uid", "")))
    memory.phase_s = heartbeat_phase(key[2])

    def tick(now: float) -> float:
        delay: float = context.run(scheduled_tick, body, memory, runtime, logger, now, indexes)
        return delay

    scheduler = runtime.policy_scheduler()
    scheduler.add(key, tick)
    try:
        await stopped.wait()
    finally:
        scheduler.remove(key, tick)


@dataclass(frozen=True)
class Indexes:
    """kopf's indexes a tick reads: the Services' slices, the Pods' IPs, the policies' claims."""

    slices: SlicesIndex
    pods: PodsIndex
    claims: ClaimsIndex


def scheduled_tick(
    body: kopf.Body,
    memory: PolicyMemory,
    runtime: Runtime,
    logger: kopf.Logger,
    now: float,
    indexes: Indexes,
) -> float:
    """One Elastico tick of one policy: seconds until the next (longer while Triton is down)."""
    if _fenced(body, memory, runtime, logger, time.monotonic()):
        return TICK_S
    # Acting on it: its gauges stay current (a paused or fenced replica's go: OperatorMetrics).
    runtime.metrics.touch_policy(*names_of(body), SERIES_TTL_S)
    count = runtime.metrics.reconciles
    memory.heartbeat_s = runtime.status_heartbeat_s()
    try:
        decided = _tick(body, memory, runtime, logger, now, indexes)
    except kopf.TemporaryError as error:
        count.labels(POLICY_KIND, "retry").inc()
        runtime.metrics.errors.labels(POLICY_KIND, "TritonUnreachable").inc()
        delay = TICK_S if error.delay is None else float(error.delay)
        logger.warning(f"tick failed temporarily: {error} (again in {delay:g} s)")
        return delay
    except kopf.PermanentError as error:
        count.labels(POLICY_KIND, "permanent").inc()
        runtime.metrics.errors.labels(POLICY_KIND, "InvalidSpec").inc()
        logger.error(f"tick failed permanently: {error}")
        return TICK_S
    except Exception as error:
        count.labels(POLICY_KIND, "error").inc()
        runtime.metrics.errors.labels(POLICY_KIND, type(error).__name__).inc()
        logger.exception(f"tick failed: {error}")
        return ERROR_BACKOFF_S
    if decided:
        count.labels(POLICY_KIND, "ok").inc()
    return TICK_S


@kopf.on.event(GROUP, VERSION, POLICY_PLURAL, id="forget-policy-series")
def forget_deleted_policy(
    type: str, namespace: str | None, name: str | None, uid: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted policy's series go (watched, not a finalizer, which could block the delete)."""
    if type == "DELETED" and name:
        runtime = runtime_of(memo)
        runtime.metrics.forget_policy(namespace or "", name, uid or "")
        runtime.oldest_claims.forget((namespace or "", name))


def _fenced(
    body: kopf.Body, memory: PolicyMemory, runtime: Runtime, logger: kopf.Logger, now: float
) -> bool:
    """Whether the fence forbids acting on the policy now (never standalone); gauge, log follow."""
    fence = runtime.fence
    if fence is None:
        return False
    namespace, name = names_of(body)
    fenced = not fence.holds(namespace, now)
    uid = str(body.get("metadata", {}).get("uid", ""))
    runtime.metrics.set_fenced(namespace, name, uid, fenced, SERIES_TTL_S)
    if fenced != memory.fenced:
        memory.fenced = fenced
        ago = fence.renewed_ago(namespace, now)
        if fenced and ago is None:
            logger.info("waiting for the API server to accept this operator's first keep-alive")
        elif fenced:
            logger.warning(
                "fenced: the API server has accepted no peering keep-alive of this operator for "
                "%.1f s (lifetime %.0f s), so a standby may take over: switching nothing until "
                "it does",
                ago,
                fence.lifetime_s,
            )
        else:
            logger.info("fence open: the API server accepts this operator's keep-alives again")
    return fenced


def _tick(
    body: kopf.Body,
    memory: PolicyMemory,
    runtime: Runtime,
    logger: kopf.Logger,
    now: float,
    indexes: Indexes,
) -> bool:
    """Decide once if due; True if it did."""
    generation = body.get("metadata", {}).get("generation")
    first = memory.status is None
    previous = memory.status if memory.status is not None else dict(body.get("status") or {})
    if first:
        observed = parse_rfc3339(previous.get("lastObservationTime"))
        # Read back from the status: one in the future (edited) would keep stale evidence.
        memory.last_observed = observed if observed is not None and observed <= now else None
    compiled = _compile(body, memory, runtime, logger, previous, generation, now)
    if compiled is None or not decision_due(memory.last_tick, now, compiled.spec.interval_seconds):
        return False
    memory.last_tick = now
    pause = _pause(body, compiled)
    # Its own state's, never the status's: anyone may have edited that.
    active = None if memory.state is None else memory.state.active
    holder = _claimant(body, indexes, runtime.settings.target_access(), runtime.oldest_claims)
    if holder is not None:
        health = Health(claimed_by=holder.shown(names_of(body)[0]), pause=pause, active=active)
        publish(body, memory, runtime, logger, previous, health, None, now, generation)
        return False
    memory.connections = connections = connect(
        memory.connections, compiled, runtime, logger, now, names_of(body)[0]
    )
    assert connections.source is not None
    advisory = compiled.spec.mode is PolicyMode.ADVISORY
    routers = connections.actuator is connections.router
    # An advisory policy writes nothing to the data plane, its tables included.
    if not advisory and routers:
        connections.router.admission = compiled.admission
        connections.router.binding = compiled.binding
    try:
        if routers:
            routing_tls(connections, compiled, runtime, now, names_of(body)[0])
            endpoints = _endpoints(body, memory, compiled, indexes, runtime, logger)
            connections.router.update(endpoints)
        # The routing the policy last had active (memory, else the status), to outvote with.
        saved = memory.state if memory.state is not None else saved_state(previous)
        expected = None if saved is None else state_routing_key(compiled.plan, saved)
        router_key = connections.actuator.active_config(expected)
    except RoutingError as error:
        memory.failures += 1
        health = Health(unreachable=str(error), pause=pause, active=active)
        publish(body, memory, runtime, logger, previous, health, None, now, generation)
        delay = retry_delay(memory.failures, compiled.spec.interval_seconds)
        message = f"Triton unreachable, nothing switched: {error}"
        raise kopf.TemporaryError(message, delay=delay) from error
    memory.failures = 0
    if memory.advised and saved is not None:
        # Advisory, or its first active tick: the policy's own state, not the routers' (which
        # it never switched); acting again, this tick puts the routers on it.
        state, note = saved, None
    else:
        state, note = align_state(
            saved,
            memory.last_observed,
            router_key,
            compiled.plan,
            now,
            compiled.spec.stale_after_seconds,
        )
    memory.advised = advisory
    if note:
        logger.info(note)
    outcome = _decide(body, compiled, connections, state, runtime, logger, now, pause, advisory)
    if outcome.observation is not None:
        memory.last_observed = outcome.observation.time
    memory.state = outcome.state
    spec = compiled.spec
    health = Health(
        binding=None
        if advisory
        else binding_condition(
            connections.router.reported,
            spec.strategy.value,
            (spec.binding.gate.instances, spec.binding.gate.slots),
            per_request=compiled.binding is not None,
        ),
        advisory_routing=_routing_names(compiled, router_key) if advisory else None,
        switch_failed=outcome.switch_failed or connections.actuator.conflict,
        metrics_error=outcome.metrics_error,
        metrics_reason=metricsauth.REASON
        if connections.credentials_problem is not None
        else "MetricsUnavailable",
        metrics_read=True,
        metrics_source=connections.source.describe(),
        pause=pause,
        active=outcome.state.active,
        decision=outcome.decision,
        routing=outcome.routing,
    )
    decided = (compiled, outcome.state, outcome.observation)
    publish(body, memory, runtime, logger, previous, health, decided, now, generation)
    return True


@dataclass(frozen=True)
class AdvisoryRouter:
    """The actuator as an advisory policy sees it: read, never switched."""

    fleet: Actuator

    def active_config(self) -> str:
        """What the actuator serves now."""
        return self.fleet.active_config()

    def switch(
        self, config: Config, blend: Config | None = None, weight: float = 0.0
    ) -> SwitchReport:
        """Nothing sent: the switch the decision would make."""
        return SwitchReport(routing_key(config, blend, weight), attempts=0, seconds=0.0)


def _routing_names(compiled: CompiledPolicy, router_key: str) -> str:
    """What the routers serve, by the front's names where it is on the front."""
    serving = routing_names(compiled.plan, router_key)
    if serving is None:
        return router_key
    active, blend, weight = serving
    return routing_label(PolicyState(active=active, blend=blend, weight=weight)) or router_key


@dataclass(frozen=True)
class Outcome:
    """What one decision saw and did."""

    observation: Observation | None
    state: PolicyState
    decision: str
    metrics_error: str | None
    switch_failed: str | None
    routing: RoutingStatus | None = None


def _decide(
    body: kopf.Body,
    compiled: CompiledPolicy,
    connections: Connections,
    state: PolicyState,
    runtime: Runtime,
    logger: kopf.Logger,
    now: float,
    pause: Pause,
    advisory: bool = False,
) -> Outcome:
    """One LiveLoop step (paused: an observation only); an Event and a count on a switch."""
    assert connections.source is not None
    loop = ObservingLoop(
        policy=compiled.policy,
        source=connections.source,
        router=AdvisoryRouter(connections.actuator) if advisory else connections.actuator,
        stale_after_s=compiled.spec.stale_after_seconds,
    )
    if pause.paused:
        observation, _ = loop.observe(now)  # a metrics problem is in loop.metrics_problem
        held = paused_state(state)
        # Holding means every pod serves it, a pod that joined or restarted meanwhile too
        # (advisory: the pods are left alone).
        routing = None if advisory else _hold_routing(compiled, connections, held, logger)
        return Outcome(
            observation, held, f"paused: holding {held.active}", loop.metrics_problem, None, routing
        )
    started = time.perf_counter()
    result = loop.step(state, now)
    runtime.metrics.decision_seconds.observe(time.perf_counter() - started)
    decision = f"{result.decision.action.value}: {result.decision.reason}"
    if result.problem and result.observation is not None:
        decision = f"{decision} ({result.problem})"
    failed = result.problem if result.decision.switched and result.switch is None else None
    routing = _routing(result.routing) if isinstance(result.routing, FleetSwitch) else None
    if result.switched:
        depth = None if result.observation is None else result.observation.queue_depth
        target = routing_label(result.state) or result.decision.target
        event = switch_event(
            routing_label(state), target, depth, result.decision.reason, advisory=advisory
        )
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        logger.info(f"{event.reason}: {event.message}")
        namespace, name = names_of(body)
        counter = runtime.metrics.advisory_switches if advisory else runtime.metrics.switches
        counter.labels(namespace, name, result.decision.action.value).inc()
    return Outcome(
        result.observation, result.state, decision, loop.metrics_problem, failed, routing
    )


def _compile(
    body: kopf.Body,
    memory: PolicyMemory,
    runtime: Runtime,
    logger: kopf.Logger,
    previous: dict[str, Any],
    generation: int | None,
    now: float,
) -> CompiledPolicy | None:
    """The compiled spec of this generation; None if its error was already reported."""
    if memory.compiled is not None and memory.compiled.generation == generation:
        return memory.compiled
    override = runtime.settings.triton_address_override
    namespace, _ = names_of(body)
    try:
        compiled = compile_policy(body.get("spec") or {}, generation, override)
        memory.compiled = authorize_policy_targets(
            compiled, namespace, runtime.settings.target_access(), override
        )
    except SpecError as error:
        if memory.reported_error == (generation, str(error)):
            return None
        memory.reported_error = (generation, str(error))
        health = Health(spec_error=str(error), spec_reason=error.reason)
        publish(body, memory, runtime, logger, previous, health, None, now, generation)
        raise kopf.PermanentError(str(error)) from error
    memory.reported_error = None
    return memory.compiled


def _endpoints(
    body: kopf.Body,
    memory: PolicyMemory,
    compiled: CompiledPolicy,
    indexes: Indexes,
    runtime: Runtime,
    logger: kopf.Logger,
) -> list[Endpoint]:
    """The pods to switch now (the Service's admitted ready endpoints, or the one address)."""
    if compiled.service is None:
        assert compiled.grpc_address is not None
        return [Endpoint(compiled.grpc_address, compiled.grpc_address)]
    namespace, _ = names_of(body)
    metrics_port = compiled.metrics_port if compiled.metrics.url is None else None
    entries, refused = admitted(
        indexes.slices.get((namespace, compiled.service), ()),
        namespace,
        lambda ip: set(indexes.pods.get((namespace, ip), ())),
        runtime.settings.target_access(),
    )
    if refused != memory.refused:
        memory.refused = refused
        if refused:
            event = refused_event(compiled.service, namespace, refused)
            logger.warning(event.message)
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    try:
        found = list(ready_endpoints([entries], compiled.grpc_port, metrics_port))
    except PortError as error:
        raise RoutingError(f"spec.routing of Service {compiled.service}: {error}") from error
    if not found and refused:
        raise RoutingError(
            "every ready address was refused: "
            + refused_endpoints(compiled.service, namespace, refused)
        )
    return found


def _claimant(
    body: kopf.Body, indexes: Indexes, access: TargetAccess, oldest: OldestClaims
) -> Claim | None:
    """The older policy acting on this one's target, under any key it is held by; None: this one."""
    namespace, _ = names_of(body)
    key = target_key(namespace, body.get("spec") or {}, access)
    mine = claim_of(body)
    if key is None or mine is None:
        return None
    keys = claim_keys(
        key, indexes.slices, lambda where, ip: set(indexes.pods.get((where, ip), ())), access
    )
    firsts = (oldest.oldest(each, indexes.claims.get(each, ())) for each in keys)
    return claimant([c for c in firsts if c is not None], mine)


def _hold_routing(
    compiled: CompiledPolicy, connections: Connections, held: PolicyState, logger: kopf.Logger
) -> RoutingStatus | None:
    """Put every pod on the held configuration; what each serves now (None: nothing held)."""
    routing = state_routing(compiled.plan, held)
    if routing is None:
        return None
    try:
        report = connections.actuator.switch(*routing)
    except RoutingError as error:
        logger.warning(f"paused: the pods could not be kept on {held.active}: {error}")
        return None
    return _routing(report) if isinstance(report, FleetSwitch) else None


def _routing(report: FleetSwitch) -> RoutingStatus:
    """The status's view of a switch of every pod."""
    return routing_status([(p.pod, p.config, p.error) for p in report.pods], report.config)


def _pause(body: kopf.Body, compiled: CompiledPolicy) -> Pause:
    """spec.paused or the pause annotation, read each tick (an annotation is no new generation)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    return pause_of(compiled.spec, annotations)
