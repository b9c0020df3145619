"""The gateway actuator's second mode: a mix as an HTTPRoute's backendRef weights across
InferencePools (one per front member) and back, and the spec's checks of a policy that uses it."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kubernetes import client

from compass.api.gateway import ActuatorType, HttpRouteTarget
from compass.api.paretopolicy import ParetoPolicySpec
from compass.controllers.gateway import (
    ModelRewriteActuator,
    applied_backend_weights,
    build_http_route,
    target_weights,
    weights_routing,
)
from compass.controllers.policy_compile import SpecError, compile_policy
from compass.controllers.policy_connections import connect
from compass.controllers.runtime import Runtime
from compass.conversion import mix_dealing
from compass.dataplane.triton import routing_key
from compass.domain.mix import Dealing

SMALL = {"pool": "qwen-small-pool", "max_tokens": 256}
LARGE = {"pool": "qwen-large-pool", "max_tokens": 256}
ROUTE = {"name": "chat"}


def route_spec(**overrides: Any) -> dict[str, Any]:
    """Two InferencePools behind one HTTPRoute, the split strategy, vLLM's queue."""
    spec: dict[str, Any] = {
        "front": [
            {"config": SMALL, "accuracy": 0.70, "latencyMeanMs": 40, "latencyP95Ms": 60},
            {"config": LARGE, "accuracy": 0.85, "latencyMeanMs": 90, "latencyP95Ms": 130},
        ],
        "slo": {"latencyMs": 600},
        "strategy": "split",
        "binding": {"mode": "workflow"},
        "routing": {"actuator": "httpRoute", "httpRoute": ROUTE},
        "metrics": {"type": "vllm", "url": "http://vllm.llm.svc:8000/metrics"},
    }
    spec.update(overrides)
    return spec


def test_the_route_has_one_rule_of_weighted_inference_pools() -> None:
    target = HttpRouteTarget(name="chat")
    weights = target_weights(SMALL, LARGE, 0.25, "pool")
    body = build_http_route("llm", target, weights)
    assert body["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert body["kind"] == "HTTPRoute"
    assert body["metadata"] == {"name": "chat", "namespace": "llm"}
    # Only the rules: the route's parentRefs are the person's, never in the policy's apply.
    assert body["spec"] == {
        "rules": [
            {
                "backendRefs": [
                    {
                        "group": "inference.networking.k8s.io",
                        "kind": "InferencePool",
                        "name": "qwen-small-pool",
                        "weight": 750,
                    },
                    {
                        "group": "inference.networking.k8s.io",
                        "kind": "InferencePool",
                        "name": "qwen-large-pool",
                        "weight": 250,
                    },
                ]
            }
        ]
    }


def test_the_weights_read_back_give_the_routing_key_that_was_written() -> None:
    plan = compile_policy(route_spec(), generation=1).plan
    target = HttpRouteTarget(name="chat")
    for blend, share in ((None, 0.0), (LARGE, 0.35), (LARGE, 1.0)):
        written = build_http_route("llm", target, target_weights(SMALL, blend, share, "pool"))
        weights = applied_backend_weights(written, target.pool_group)
        assert weights is not None
        assert weights_routing(weights, plan, "pool", "here") == routing_key(SMALL, blend, share)


def test_a_route_someone_else_shaped_serves_nothing_on_the_front() -> None:
    plan = compile_policy(route_spec(), generation=1).plan
    pools = {"group": "inference.networking.k8s.io", "kind": "InferencePool"}
    # A Service beside the pools takes its share too: no mix of the front.
    shared = {
        "spec": {
            "rules": [
                {
                    "backendRefs": [
                        {**pools, "name": "qwen-small-pool", "weight": 9},
                        {"kind": "Service", "name": "legacy", "port": 80, "weight": 1},
                    ]
                }
            ]
        }
    }
    weights = applied_backend_weights(shared, "inference.networking.k8s.io")
    assert weights is not None
    assert weights_routing(weights, plan, "pool", "HTTPRoute llm/chat").startswith(
        "HTTPRoute llm/chat weights"
    )
    # No weight: the Gateway API's default of 1 each.
    even = {"spec": {"rules": [{"backendRefs": [{**pools, "name": n} for n in ("a", "b")]}]}}
    assert applied_backend_weights(even, "inference.networking.k8s.io") == {"a": 1.0, "b": 1.0}
    # Pools of another group, or no rule at all: nothing the policy wrote.
    assert applied_backend_weights(even, "llm-d.ai") is None
    assert applied_backend_weights({"spec": {}}, "inference.networking.k8s.io") is None


def test_a_route_policy_compiles_to_the_same_actuator_dealing_by_draw() -> None:
    compiled = compile_policy(route_spec(), generation=1)
    assert compiled.route == HttpRouteTarget(name="chat")
    assert compiled.rewrite is None
    assert compiled.actuator is ActuatorType.HTTP_ROUTE
    assert compiled.grpc_address is None
    assert mix_dealing(ParetoPolicySpec.model_validate(route_spec())) is Dealing.DRAW
    actuator = ModelRewriteActuator(client.ApiClient(), "llm", compiled.route, compiled.plan)
    assert actuator.object == ("gateway.networking.k8s.io", "v1", "llm", "httproutes", "chat")
    assert actuator.where == "HTTPRoute llm/chat"


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"binding": {"mode": "per-request"}}, "binding.mode", "set binding.mode: workflow"),
        ({"admission": {"enabled": True}}, "admission.enabled", "routing.actuator httpRoute"),
        ({"metrics": None}, "metrics.url", "routing.actuator httpRoute"),
        ({"routing": {"actuator": "httpRoute"}}, "routing.httpRoute", "give its name"),
        ({"routing": {"httpRoute": ROUTE}}, "routing.httpRoute", "set routing.actuator: httpRoute"),
        (
            {
                "routing": {
                    "actuator": "inferenceModelRewrite",
                    "httpRoute": ROUTE,
                    "modelRewrite": {"name": "c", "poolRef": {"name": "p"}, "model": "c"},
                }
            },
            "routing.httpRoute",
            "actuator is inferenceModelRewrite",
        ),
        (
            {
                "front": [
                    {"config": SMALL, "accuracy": 0.7, "latencyMeanMs": 40, "latencyP95Ms": 60},
                    {
                        "config": {**SMALL, "max_tokens": 512},
                        "accuracy": 0.8,
                        "latencyMeanMs": 80,
                        "latencyP95Ms": 120,
                    },
                ]
            },
            "front[1].config.pool",
            "give each entry its own InferencePool",
        ),
        (
            {"routing": {"actuator": "httpRoute", "httpRoute": {"name": "chat", "parameter": "p"}}},
            "front[0].config",
            "routing.httpRoute.parameter",
        ),
    ],
)
def test_a_route_spec_that_cannot_work_names_the_field_and_the_fix(
    change: dict[str, Any], field: str, says: str
) -> None:
    spec = {k: v for k, v in route_spec(**change).items() if v is not None}
    with pytest.raises(SpecError) as raised:
        compile_policy(spec, generation=1)
    assert field in str(raised.value)
    assert says in str(raised.value)


def test_a_policy_pointed_at_another_route_writes_to_that_route() -> None:
    """A new generation naming another HTTPRoute gets an actuator for it (the connection's key
    holds the route, as it holds the rewrite)."""
    runtime = Runtime()
    runtime._api = client.ApiClient()
    logger: Any = kopf.LocalObjectLogger(body={}, settings=kopf.OperatorSettings())
    try:
        first = connect(None, compile_policy(route_spec(), 1), runtime, logger, 0.0, "llm")
        assert isinstance(first.actuator, ModelRewriteActuator)
        assert first.actuator.where == "HTTPRoute llm/chat"
        moved = route_spec(routing={"actuator": "httpRoute", "httpRoute": {"name": "chat-v2"}})
        second = connect(first, compile_policy(moved, 2), runtime, logger, 1.0, "llm")
        assert isinstance(second.actuator, ModelRewriteActuator)
        assert second.actuator.where == "HTTPRoute llm/chat-v2"
        # The same route again: the connection (and what its actuator read) is kept.
        assert connect(second, compile_policy(moved, 3), runtime, logger, 2.0, "llm") is second
    finally:
        runtime.stop()
