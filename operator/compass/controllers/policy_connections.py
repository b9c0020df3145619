"""A ParetoPolicy's routers and metrics source, rebuilt only when they or their Secrets change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client

from compass.api.gateway import ActuatorType, HttpRouteTarget, ModelRewriteTarget
from compass.api.metricsource import TritonTls
from compass.controllers import kubeapi, metricsauth
from compass.controllers.gateway import ModelRewriteActuator
from compass.controllers.policy_compile import CompiledPolicy, MetricsTarget
from compass.controllers.runtime import Runtime
from compass.dataplane.actuator import Actuator
from compass.dataplane.fleet import FleetQueueDepth, RouterFleet
from compass.dataplane.httpauth import HttpAuth
from compass.dataplane.metrics import (
    QueueDepthSource,
    SharedReads,
    UnavailableSource,
    source_for,
)
from compass.dataplane.triton import RoutingError

# A control request takes milliseconds: a pod silent for a second is reported lagging and asked
# again next tick, rather than holding every decision of the policy.
ROUTER_TIMEOUT_S = 1.0
ROUTER_ATTEMPTS = 1
ROUTER_BACKOFF_S = 0.05


@dataclass
class Connections:
    """The routers (one per pod) and the metrics source of one target, and its Secrets' state."""

    key: tuple[
        str | None,
        str | None,
        str,
        MetricsTarget,
        TritonTls | None,
        ModelRewriteTarget | None,
        HttpRouteTarget | None,
    ]
    # The Triton routers (none reached where the policy acts through another actuator).
    router: RouterFleet
    source: QueueDepthSource | None = None
    # What the decisions are written to: the routers, or another actuator of ACTUATORS.
    actuator: Actuator = field(init=False)
    secret_version: str | None = None
    secret_read_at: float | None = None
    credentials_problem: str | None = None
    # The same for the routers' TLS (spec.routing.tls).
    tls_version: str | None = None
    tls_read_at: float | None = None
    tls_problem: str | None = None


def connect(
    current: Connections | None,
    compiled: CompiledPolicy,
    runtime: Runtime,
    logger: kopf.Logger,
    now: float,
    namespace: str,
) -> Connections:
    """The routers and metrics source of the compiled target (reused while it holds)."""
    target = compiled.metrics
    key = (
        compiled.service,
        compiled.grpc_address,
        compiled.router_model,
        target,
        compiled.tls,
        compiled.rewrite,
        compiled.route,
    )
    if current is None or current.key != key:
        if current is not None:
            current.router.close()
        fleet = RouterFleet(
            model=compiled.router_model,
            timeout_s=ROUTER_TIMEOUT_S,
            attempts=ROUTER_ATTEMPTS,
            backoff_s=ROUTER_BACKOFF_S,
        )
        current = Connections(key, fleet)
        current.actuator = ACTUATORS[compiled.actuator](fleet, compiled, runtime, namespace)
    elif isinstance(current.actuator, ModelRewriteActuator):
        # A new generation with the same target: the gateway maps the new plan's members.
        current.actuator.plan = compiled.plan
    connections = current
    connections.router.shared = runtime.policy_scheduler().reads
    _refresh_source(connections, compiled, runtime, logger, now, namespace)
    return connections


ActuatorFactory = Callable[[RouterFleet, CompiledPolicy, Runtime, str], Actuator]


def _routers(fleet: RouterFleet, compiled: CompiledPolicy, runtime: Runtime, ns: str) -> Actuator:
    """The Triton routers of the policy's target: the fleet itself."""
    return fleet


def _gateway(
    fleet: RouterFleet, compiled: CompiledPolicy, runtime: Runtime, namespace: str
) -> Actuator:
    """llm-d's InferenceModelRewrite (routing.modelRewrite) or the HTTPRoute (routing.httpRoute)."""
    target = compiled.route or compiled.rewrite
    assert target is not None
    return ModelRewriteActuator(runtime.api(), namespace, target, compiled.plan)


# The actuators by routing.actuator, as KEDA's scalers by their trigger's type.
ACTUATORS: dict[ActuatorType, ActuatorFactory] = {
    ActuatorType.TRITON: _routers,
    ActuatorType.INFERENCE_MODEL_REWRITE: _gateway,
    ActuatorType.HTTP_ROUTE: _gateway,
}


def routing_tls(
    connections: Connections,
    compiled: CompiledPolicy,
    runtime: Runtime,
    now: float,
    namespace: str,
) -> None:
    """The routers' TLS from spec.routing.tls's Secret, read when due, reconnecting on a change;
    RoutingError naming the Secret, the key and the fix while it cannot be had."""
    tls = compiled.tls
    if tls is None:
        return
    due = metricsauth.recheck_due(
        connections.tls_read_at, now, available=connections.tls_problem is None, rejected=False
    )
    if not due:
        if connections.tls_problem is not None:
            raise RoutingError(connections.tls_problem)
        return
    connections.tls_read_at = now
    secret, unread = _read_secret(runtime, namespace, tls.secret_ref.name, "spec.routing.tls")
    if unread is not None:
        if connections.router.tls is not None:
            return  # keep the TLS built: the Secret may well still be good
        connections.tls_problem = unread
        raise RoutingError(unread)
    version = metricsauth.resource_version(secret)
    if (
        version == connections.tls_version
        and connections.tls_problem is None
        and connections.router.tls is not None
    ):
        return
    try:
        built = metricsauth.triton_tls(tls, secret, namespace, "spec.routing.tls")
    except metricsauth.CredentialsError as error:
        connections.tls_problem = str(error)
        raise RoutingError(connections.tls_problem) from None
    connections.tls_problem, connections.tls_version = None, version
    connections.router.use_tls(built)


def _refresh_source(
    connections: Connections,
    compiled: CompiledPolicy,
    runtime: Runtime,
    logger: kopf.Logger,
    now: float,
    namespace: str,
) -> None:
    """Build the metrics source, its Secret read when due (first, after a 401/403, periodically)."""
    target = compiled.metrics
    name = metricsauth.secret_name(target.authentication)
    rejected = bool(getattr(connections.source, "auth_rejected", False))
    due = metricsauth.recheck_due(
        connections.secret_read_at,
        now,
        available=connections.credentials_problem is None,
        rejected=rejected,
    )
    if connections.source is not None and (name is None or not due):
        return
    secret = None
    if name is not None:
        connections.secret_read_at = now
        secret, unread = _read_secret(runtime, namespace, name, "spec.metrics.authentication")
        if unread is not None:
            if connections.source is None:
                _unavailable(connections, compiled, unread, logger)
            return  # keep what was built: the credentials may well still be good
        version = metricsauth.resource_version(secret)
        unchanged = (
            connections.source is not None
            and connections.credentials_problem is None
            and version == connections.secret_version
        )
        connections.secret_version = version
        if unchanged:
            return
    try:
        auth = (
            None
            if target.authentication is None
            else metricsauth.credentials(target.authentication, secret, namespace)
        )
    except metricsauth.CredentialsError as error:
        _unavailable(connections, compiled, str(error), logger)
        return
    if connections.credentials_problem is not None:
        logger.info(f"metrics credentials readable again from Secret {namespace}/{name}")
    connections.credentials_problem = None
    connections.source = _source(connections, compiled, auth, runtime.policy_scheduler().reads)


def _unavailable(
    connections: Connections, compiled: CompiledPolicy, problem: str, logger: kopf.Logger
) -> None:
    """A source that says why the metrics cannot be read (logged once a change, no Secret value)."""
    if problem != connections.credentials_problem:
        logger.warning(f"metrics credentials unavailable: {problem}")
    connections.credentials_problem = problem
    where = compiled.metrics.url or "Triton's /metrics of every pod"
    connections.source = UnavailableSource(f"metrics {where}", problem)


def _source(
    connections: Connections,
    compiled: CompiledPolicy,
    auth: HttpAuth | None,
    shared: SharedReads | None = None,
) -> QueueDepthSource:
    """The target's metrics source, its reads shared with every policy's reading the same."""
    target, fleet = compiled.metrics, connections.router
    if target.url is None:  # Triton's /metrics of every pod
        return FleetQueueDepth(
            lambda: fleet.endpoints, compiled.router_model, auth=auth, shared=shared
        )
    return source_for(
        target.type.value,
        target.url,
        compiled.router_model,
        target.query,
        target.arrivals_query,
        pods=lambda: max(len(fleet.endpoints), 1),
        age_query=target.age_query,
        auth=auth,
        shared=shared,
    )


def _read_secret(
    runtime: Runtime, namespace: str, name: str, path: str
) -> tuple[dict[str, Any] | None, str | None]:
    """The Secret ``path``.secretRef names (None: not found), or why it could not be read: the status
    alone, nothing of the answer (which a proxy could fill)."""
    try:
        secret: dict[str, Any] | None = kubeapi.read(
            client.CoreV1Api(runtime.api()).read_namespaced_secret, name, namespace
        )
        return secret, None
    except kubeapi.ERRORS as error:
        status = getattr(error, "status", None)
    if status == 403:
        why = (
            "the operator may not read Secrets here (chart value "
            "metricsAuthentication.readSecrets, and its RBAC)"
        )
    else:
        why = f"HTTP {status}" if status else "the API server did not answer"
    return None, f"Secret {namespace}/{name} ({path}.secretRef) could not be read: {why}; retrying"
