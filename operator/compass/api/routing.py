"""Where a ParetoPolicy's decisions take effect: the Triton routers behind a Service or at one
address, or a gateway object (llm-d's InferenceModelRewrite, an HTTPRoute) by its actuator."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from compass.api.gateway import ActuatorType, HttpRouteTarget, ModelRewriteTarget
from compass.api.meta import (
    DEFAULT_ROUTER_MODEL,
    MAX_ENDPOINT_LENGTH,
    CamelModel,
    ShortText,
)
from compass.api.metricsource import TritonTls
from compass.api.rules import CelRule, cel_rules
from compass.api.urls import ENDPOINT_FIX, ENDPOINT_PATTERN, cel_matches, endpoint_problem

PortRef = Annotated[
    int | str,
    Field(
        description="A port of the pods: a number, or the name of a port of the Service (as its "
        "EndpointSlices name it)."
    ),
]


# Each gateway actuator, the routing field naming what it writes, and what to give there.
_GATEWAY_FIELDS = (
    (
        ActuatorType.INFERENCE_MODEL_REWRITE,
        "modelRewrite",
        "model_rewrite",
        "give its name, poolRef and the clients' model",
    ),
    (ActuatorType.HTTP_ROUTE, "httpRoute", "http_route", "give its name"),
)


class RoutingTarget(CamelModel):
    """The Triton routers whose active configuration the policy switches: every ready pod
    behind a Service, or one Triton at a fixed address."""

    model_config = cel_rules(
        CelRule(
            rule="!(has(self.service) && has(self.grpcEndpoint))",
            message="give routing.service (Triton pods in the cluster) or "
            "routing.grpcEndpoint (one Triton outside it), not both",
        ),
        CelRule(
            rule=f"!has(self.grpcEndpoint) || {cel_matches('self.grpcEndpoint', ENDPOINT_PATTERN)}",
            message="grpcEndpoint must be host:port with a port in 1-65535 "
            "(e.g. triton.example.com:8001)",
            field_path=".grpcEndpoint",
        ),
    )

    service: ShortText | None = Field(
        default=None,
        description="A Service in the policy's namespace: every ready Triton pod behind it (its "
        "EndpointSlices, watched) is switched, and its queue read.",
    )
    grpc_port: PortRef = "grpc"
    metrics_port: PortRef = "metrics"
    grpc_endpoint: str | None = Field(
        default=None,
        max_length=MAX_ENDPOINT_LENGTH,
        description="One Triton's gRPC endpoint, host:port, for a Triton outside the cluster "
        "(e.g. triton.example.com:8001).",
    )
    router_model: ShortText = Field(
        default=DEFAULT_ROUTER_MODEL,
        description="Name of the router model.",
    )
    tls: TritonTls | None = Field(
        default=None,
        description="TLS (and mutual TLS) to the routers' gRPC port (none: plaintext).",
    )
    actuator: ActuatorType = Field(
        default=ActuatorType.TRITON,
        description="What the decisions are written to: triton (the routers' control model, "
        "the default), inferenceModelRewrite (llm-d's gateway: the mix as the target weights "
        "of modelRewrite, which the endpoint picker draws per request) or httpRoute (the mix "
        "as the backendRef weights of httpRoute across one InferencePool per member).",
    )
    model_rewrite: ModelRewriteTarget | None = Field(
        default=None,
        description="The InferenceModelRewrite the inferenceModelRewrite actuator writes.",
    )
    http_route: HttpRouteTarget | None = Field(
        default=None,
        description="The HTTPRoute the httpRoute actuator writes.",
    )

    @property
    def gateway(self) -> ModelRewriteTarget | HttpRouteTarget | None:
        """The gateway object the actuator writes (None: it switches Triton routers)."""
        return self.model_rewrite if self.model_rewrite is not None else self.http_route

    @model_validator(mode="after")
    def _actuator_target(self) -> RoutingTarget:
        for actuator, field, attribute, hint in _GATEWAY_FIELDS:
            given = getattr(self, attribute) is not None
            if self.actuator is actuator and not given:
                raise ValueError(
                    f"routing.{field}: not set, and actuator {actuator.value} writes it; {hint}"
                )
            if self.actuator is not actuator and given:
                raise ValueError(
                    f"routing.{field}: set, but actuator is {self.actuator.value}; set "
                    f"routing.actuator: {actuator.value}, or remove {field}"
                )
        if self.actuator is not ActuatorType.TRITON and (self.service or self.grpc_endpoint):
            raise ValueError(
                f"routing.service/grpcEndpoint: set with actuator {self.actuator.value}, which "
                "switches no router; remove them"
            )
        return self

    @model_validator(mode="after")
    def _one_target(self) -> RoutingTarget:
        # Checked here, on the object, where the API server's CEL rule reports it too.
        problem = None if self.grpc_endpoint is None else endpoint_problem(self.grpc_endpoint)
        if problem is not None:
            # Named from the object's own field, as errors.first_error moves it into the path.
            raise ValueError(f"routing.grpcEndpoint: {problem}; {ENDPOINT_FIX}")
        if self.service and self.grpc_endpoint:
            raise ValueError(
                "give routing.service (Triton pods in the cluster) or routing.grpcEndpoint "
                "(one Triton outside it), not both"
            )
        return self
