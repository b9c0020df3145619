"""The llm-d gateway actuator's pure parts: a mix as InferenceModelRewrite target weights and
back, and the spec's checks of a policy that acts through it."""

from __future__ import annotations

from typing import Any

import pytest

from compass.api.gateway import ModelRewriteTarget, PoolReference
from compass.controllers.gateway import (
    WEIGHT_TOTAL,
    applied_weights,
    build_model_rewrite,
    target_weights,
    weights_routing,
)
from compass.controllers.policy_compile import SpecError, compile_policy
from compass.dataplane.metrics import VLLM_WAITING_METRIC, TritonQueueDepth
from compass.dataplane.triton import parse_routing_key, routing_key
from compass.domain.space import config_key
from compass_dev.processes import QuietHandler, serve_http

SMALL = {"model": "qwen-small", "max_tokens": 256}
LARGE = {"model": "qwen-large", "max_tokens": 256}
TARGET = {"name": "chat", "poolRef": {"name": "qwen-pool"}, "model": "chat"}


def gateway_spec(**overrides: Any) -> dict[str, Any]:
    """Two model variants behind one llm-d pool, the split strategy, vLLM's queue."""
    spec: dict[str, Any] = {
        "front": [
            {"config": SMALL, "accuracy": 0.70, "latencyMeanMs": 40, "latencyP95Ms": 60},
            {"config": LARGE, "accuracy": 0.85, "latencyMeanMs": 90, "latencyP95Ms": 130},
        ],
        "slo": {"latencyMs": 600},
        "strategy": "split",
        "binding": {"mode": "workflow"},
        "routing": {"actuator": "inferenceModelRewrite", "modelRewrite": TARGET},
        "metrics": {"type": "vllm", "url": "http://vllm.llm.svc:8000/metrics"},
    }
    spec.update(overrides)
    return spec


def test_a_mix_is_written_as_two_targets_whose_weights_carry_its_share() -> None:
    assert target_weights(SMALL, LARGE, 0.25, "model") == (
        ("qwen-small", 750),
        ("qwen-large", 250),
    )
    # One member: one target with the whole weight (the CRD allows no weight 0).
    assert target_weights(SMALL, None, 0.0, "model") == (("qwen-small", WEIGHT_TOTAL),)
    assert target_weights(SMALL, LARGE, 1.0, "model") == (("qwen-large", WEIGHT_TOTAL),)


def test_the_rewrite_has_one_rule_matching_the_clients_model() -> None:
    target = ModelRewriteTarget(
        name="chat", pool_ref=PoolReference(name="qwen-pool", group="llm-d.ai"), model="chat"
    )
    body = build_model_rewrite("llm", target, (("qwen-small", 600), ("qwen-large", 400)))
    assert body["apiVersion"] == "llm-d.ai/v1alpha2"
    assert body["kind"] == "InferenceModelRewrite"
    assert body["metadata"] == {"name": "chat", "namespace": "llm"}
    assert body["spec"]["poolRef"] == {"name": "qwen-pool", "group": "llm-d.ai"}
    assert body["spec"]["rules"] == [
        {
            "matches": [{"model": {"type": "Exact", "value": "chat"}}],
            "targets": [
                {"modelRewrite": "qwen-small", "weight": 600},
                {"modelRewrite": "qwen-large", "weight": 400},
            ],
        }
    ]


def test_the_weights_read_back_give_the_routing_key_that_was_written() -> None:
    plan = compile_policy(gateway_spec(), generation=1).plan
    target = ModelRewriteTarget.model_validate(TARGET)
    for blend, share in ((None, 0.0), (LARGE, 0.35), (LARGE, 1.0)):
        written = build_model_rewrite("llm", target, target_weights(SMALL, blend, share, "model"))
        weights = applied_weights(written, "chat")
        assert weights is not None
        assert weights_routing(weights, plan, "model", "rewrite") == routing_key(
            SMALL, blend, share
        )


def test_weights_that_are_no_mix_of_the_front_are_on_no_front() -> None:
    plan = compile_policy(gateway_spec(), generation=1).plan
    key = weights_routing({"qwen-small": 1, "other": 1}, plan, "model", "rewrite x")
    assert key == "rewrite x weights other=1, qwen-small=1"
    base, blend, _ = parse_routing_key(key)
    assert blend is None
    assert base not in {config_key(SMALL), config_key(LARGE)}
    # A rule for another model is none of the policy's.
    body = {"spec": {"rules": [{"matches": [{"model": {"value": "x"}}], "targets": []}]}}
    assert applied_weights(body, "chat") is None


def test_a_gateway_policy_compiles_with_no_router_and_reads_vllms_queue() -> None:
    compiled = compile_policy(gateway_spec(), generation=1)
    assert compiled.rewrite is not None
    assert compiled.rewrite.name == "chat"
    assert compiled.grpc_address is None
    assert compiled.service is None
    assert compiled.metrics.type.value == "vllm"


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"binding": {"mode": "per-request"}}, "binding.mode", "set binding.mode: workflow"),
        ({"metrics": None}, "metrics.url", "vllm:num_requests_waiting"),
        (
            {"routing": {"actuator": "inferenceModelRewrite"}},
            "routing.modelRewrite",
            "give its name, poolRef",
        ),
        (
            {"routing": {"modelRewrite": TARGET}},
            "routing.modelRewrite",
            "set routing.actuator: inferenceModelRewrite",
        ),
        (
            {
                "front": [
                    {"config": SMALL, "accuracy": 0.7, "latencyMeanMs": 40, "latencyP95Ms": 60},
                    {
                        "config": {"model": "qwen-small", "max_tokens": 512},
                        "accuracy": 0.8,
                        "latencyMeanMs": 80,
                        "latencyP95Ms": 120,
                    },
                ]
            },
            "front[1].config.model",
            "give each entry its own model",
        ),
    ],
)
def test_a_gateway_spec_that_cannot_work_names_the_field_and_the_fix(
    change: dict[str, Any], field: str, says: str
) -> None:
    spec = {k: v for k, v in gateway_spec(**change).items() if v is not None}
    with pytest.raises(SpecError) as raised:
        compile_policy(spec, generation=1)
    assert field in str(raised.value)
    assert says in str(raised.value)


def test_a_model_servers_waiting_requests_are_summed_over_its_models() -> None:
    page = (
        b"# TYPE vllm:num_requests_waiting gauge\n"
        b'vllm:num_requests_waiting{model_name="qwen-small"} 3.0\n'
        b'vllm:num_requests_waiting{model_name="qwen-large"} 2.0\n'
        b'vllm:num_requests_running{model_name="qwen-small"} 7.0\n'
    )

    class Metrics(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

    with serve_http(Metrics) as address:
        source = TritonQueueDepth(f"http://{address}/metrics", None, VLLM_WAITING_METRIC)
        reading = source.read()
    assert reading.queue_depth == 5.0
    assert reading.arrivals_total is None
    assert "vllm:num_requests_waiting" in source.describe()
