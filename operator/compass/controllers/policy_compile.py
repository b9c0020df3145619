"""A ParetoPolicy's spec, compiled (plan, policy, endpoints), or a SpecError naming the fix."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from compass.api.errors import field_path, first_error
from compass.api.gateway import ActuatorType, HttpRouteTarget, ModelRewriteTarget
from compass.api.metricsource import MetricsAuthentication, MetricsSourceType, TritonTls
from compass.api.paretopolicy import ParetoPolicySpec
from compass.api.routing import RoutingTarget
from compass.controllers.targets import TargetAccess, TargetRefusedError, resolve_host, resolve_url
from compass.conversion import admission_table, binding_table, policy_plan, runtime_policy
from compass.domain.planner import Plan, PlanError
from compass.domain.strategy import StrategyPolicy

# Triton's default metrics port, used when the spec names no metrics URL.
TRITON_METRICS_PORT = 8002
# The plans made lately, by what policy_plan reads of a spec: a thousand policies with one front
# are planned once (20 ms each), so a restarted operator acts on all within seconds.
PLAN_CACHE_SIZE = 256
_PLAN_INPUTS = {"front", "slo", "threshold_model", "switch_delay_ms", "router_instances"}
_PLANS: OrderedDict[str, Plan] = OrderedDict()
_PLANS_LOCK = threading.Lock()


class SpecError(ValueError):
    """A spec that can never work (InvalidSpec) or that settings refuse (TargetNotAllowed)."""

    def __init__(self, field: str, what: str, fix: str, reason: str = "InvalidSpec") -> None:
        super().__init__(f"spec.{field}: {what}; {fix}")
        self.field, self.what, self.fix, self.reason = field, what, fix, reason


@dataclass(frozen=True)
class MetricsTarget:
    """Where the queue depth is read (a Triton source without a URL: every pod's own /metrics)."""

    type: MetricsSourceType
    url: str | None
    query: str | None
    arrivals_query: str | None
    age_query: str | None = None
    # Credentials, CA and headers (read from the Secret it names when the source is built).
    authentication: MetricsAuthentication | None = None


@dataclass(frozen=True)
class CompiledPolicy:
    """A validated spec and what it derives, for one generation."""

    generation: int | None
    spec: ParetoPolicySpec
    policy: StrategyPolicy
    grpc_address: str | None
    router_model: str
    metrics: MetricsTarget
    service: str | None = None
    grpc_port: int | str = "grpc"
    metrics_port: int | str = "metrics"
    # The llm-d InferenceModelRewrite the policy writes instead of switching routers.
    rewrite: ModelRewriteTarget | None = None
    # Or the HTTPRoute whose backendRefs it weights across InferencePools.
    route: HttpRouteTarget | None = None

    @property
    def actuator(self) -> ActuatorType:
        """What the decisions are written to."""
        if self.route is not None:
            return ActuatorType.HTTP_ROUTE
        return ActuatorType.TRITON if self.rewrite is None else ActuatorType.INFERENCE_MODEL_REWRITE

    @property
    def plan(self) -> Plan:
        """The planned front and its thresholds."""
        return self.policy.plan

    @property
    def tls(self) -> TritonTls | None:
        """TLS to the routers' gRPC port (None: plaintext)."""
        return None if self.spec.routing is None else self.spec.routing.tls

    @cached_property
    def admission(self) -> dict[str, Any] | None:
        """The table every router gets with each switch (None: off), built once a generation."""
        return admission_table(self.spec, self.plan)

    @cached_property
    def binding(self) -> dict[str, Any] | None:
        """The late-binding table every router gets with each switch (None: off); built once."""
        return binding_table(self.spec, self.plan)


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
        policy = runtime_policy(spec, _plan(spec))
    except PlanError as error:
        raise SpecError(error.field, error.what, error.fix) from error
    routing = spec.routing or RoutingTarget()
    # A gateway switches no router: its queue is read at the spec's metrics URL.
    gateway = routing.gateway is not None
    if gateway and (spec.metrics is None or not spec.metrics.url):
        raise SpecError(
            "metrics.url",
            f"not set, and the gateway (routing.actuator {routing.actuator.value}) has no router "
            "whose /metrics could be read",
            "give a model server's metrics URL (metrics.type: vllm, url: "
            "http://vllm.ns.svc:8000/metrics) or Prometheus with a query of vLLM's "
            "vllm:num_requests_waiting",
        )
    # The address override (a development setting) wins over a Service.
    service = None if address_override or gateway else routing.service
    address, metrics_host = None, None
    if not service and not gateway:
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
        rewrite=routing.model_rewrite,
        route=routing.http_route,
    )


def _plan(spec: ParetoPolicySpec) -> Plan:
    """policy_plan(spec), made once for every spec that plans the same (PlanError as it)."""
    inputs = spec.model_dump(mode="json", include=_PLAN_INPUTS)
    inputs["slack_buffer_ms"] = spec.hysteresis.slack_buffer_ms
    key = json.dumps(inputs, sort_keys=True)
    with _PLANS_LOCK:
        plan = _PLANS.get(key)
    if plan is None:
        plan = policy_plan(spec)
        with _PLANS_LOCK:
            _PLANS[key] = plan
            while len(_PLANS) > PLAN_CACHE_SIZE:
                _PLANS.popitem(last=False)
    return plan


def authorize_policy_targets(
    compiled: CompiledPolicy,
    namespace: str,
    access: TargetAccess,
    address_override: str | None = None,
) -> CompiledPolicy:
    """The compiled policy with every host it reaches allowed by the settings (the address
    override, the operator's own, unchecked); SpecError (TargetNotAllowed) if one is not."""
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
    """The spec's metrics source; none: Triton's /metrics on the routing host, or every pod's."""
    source = spec.metrics
    if source is None or source.type is not MetricsSourceType.PROMETHEUS:
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
        if source is not None and source.type is MetricsSourceType.VLLM and not source.url:
            raise SpecError(
                "metrics.url",
                "not set for a vLLM source",
                "give a model server's metrics URL (e.g. http://vllm.ns.svc:8000/metrics)",
            )
        url = (source.url if source is not None else None) or (
            None if triton_host is None else f"http://{triton_host}:{TRITON_METRICS_PORT}/metrics"
        )
        auth = None if source is None else source.authentication
        kind = MetricsSourceType.TRITON if source is None else source.type
        return MetricsTarget(kind, url, None, None, authentication=auth)
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
