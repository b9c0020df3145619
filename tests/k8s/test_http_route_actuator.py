"""The gateway actuator's HTTPRoute mode on the real API server with the Gateway API's own
HTTPRoute CRD (tests/k8s/gateway-api/; its structural schema: for_this_api_server): a policy moves the route's backendRef weights across two
InferencePools through a load change, leaves the route's parentRefs to whoever set them, and a
deleted policy leaves its last weights.

The queue is a model server's /metrics giving vLLM's vllm:num_requests_waiting: a small HTTP
server here, which the test sets (no vLLM on this machine).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from cluster import Cluster, wait_for
from e2e_shared import Policies, condition
from kubernetes import client

from compass.api.gateway import (
    HTTPROUTE_GROUP,
    HTTPROUTE_KIND,
    HTTPROUTE_PLURAL,
    HTTPROUTE_VERSION,
    POOL_GROUP,
)
from compass.controllers import kubeapi
from compass.controllers.gateway import WEIGHTS_FIELD_MANAGER, applied_backend_weights
from compass.controllers.policy_compile import compile_policy
from compass_dev.processes import QuietHandler, serve_http

GATEWAY_API_CRDS = Path(__file__).resolve().parent / "gateway-api"
SMALL = {"pool": "qwen-small-pool", "max_tokens": 256}
LARGE = {"pool": "qwen-large-pool", "max_tokens": 256}
PARENT = {"name": "inference-gateway"}
# Far past what the large pool may queue under the 600 ms SLO (a few requests).
BUSY = 40


class VllmMetrics(QuietHandler):
    """A model server's /metrics: vLLM's waiting-requests gauge, as the test sets it."""

    waiting: ClassVar[float] = 0.0

    def do_GET(self) -> None:
        page = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="qwen"}} {self.waiting}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)


def for_this_api_server(node: Any) -> Any:
    """The CRD as this tier's API server (1.20) can hold it: without its CEL rules, which that
    version predates (server-side apply refuses them, create drops them), and without the empty
    string defaults of its backendRefs' group, which 1.20 reads as null and rejects. The schema's
    structure, what the policy's apply is checked against, is the published one."""
    if isinstance(node, dict):
        return {
            key: for_this_api_server(value)
            for key, value in node.items()
            if key != "x-kubernetes-validations" and not (key == "default" and value == "")
        }
    if isinstance(node, list):
        return [for_this_api_server(item) for item in node]
    return node


@pytest.fixture(scope="module")
def route_crd(k8s_cluster: Cluster) -> None:
    """The Gateway API's HTTPRoute CRD, established (cluster-wide: it stays). Created, not
    applied: it is too large for apply's annotation."""
    published = GATEWAY_API_CRDS / "gateway.networking.k8s.io_httproutes.yaml"
    crd = for_this_api_server(yaml.safe_load(published.read_text(encoding="utf-8")))
    created = k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(crd), check=False)
    assert created.returncode == 0 or "AlreadyExists" in created.stderr, created.stderr
    k8s_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        f"crd/{HTTPROUTE_PLURAL}.{HTTPROUTE_GROUP}",
    )


@pytest.fixture
def vllm() -> Iterator[str]:
    """The model server's metrics URL, its queue empty."""
    VllmMetrics.waiting = 0.0
    with serve_http(VllmMetrics) as address:
        yield f"http://{address}/metrics"


def route_spec(route: str, metrics_url: str) -> dict[str, Any]:
    """Two InferencePools behind one HTTPRoute, written as its weights; cooldowns of 2 s."""
    return {
        "front": [
            {"config": SMALL, "accuracy": 0.70, "latencyMeanMs": 40, "latencyP95Ms": 60},
            {"config": LARGE, "accuracy": 0.85, "latencyMeanMs": 90, "latencyP95Ms": 130},
        ],
        "slo": {"latencyMs": 600},
        "hysteresis": {
            "upscaleCooldownSeconds": 0,
            "downscaleCooldownSeconds": 2,
            "cooldownExponent": 0,
            "slackBufferMs": 20,
        },
        "binding": {"mode": "workflow"},
        "routing": {"actuator": "httpRoute", "httpRoute": {"name": route}},
        "metrics": {"type": "vllm", "url": metrics_url},
        "intervalSeconds": 1,
    }


def _route(api: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    where = (HTTPROUTE_GROUP, HTTPROUTE_VERSION, namespace, HTTPROUTE_PLURAL)
    found = kubeapi.read(api.get_namespaced_custom_object, *where, name)
    return None if found is None else dict(found)


def wait_weights(
    api: client.CustomObjectsApi,
    namespace: str,
    name: str,
    wanted: dict[str, float],
    timeout_s: float,
) -> dict[str, Any]:
    """The route once its pool backendRefs have exactly these weights."""

    def shown() -> dict[str, Any] | None:
        found = _route(api, namespace, name)
        weights = None if found is None else applied_backend_weights(found, POOL_GROUP)
        return found if weights == wanted else None

    return dict(wait_for(shown, timeout_s, f"{name}'s weights to be {wanted}", 0.1))


def test_a_policy_moves_the_routes_pool_weights_and_leaves_its_parents_alone(
    k8s_api: Any, route_crd: None, policies: Policies, vllm: str
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    namespace = policies.namespace
    # The platform team's route: attached to their Gateway, no rules of theirs.
    theirs = {
        "apiVersion": f"{HTTPROUTE_GROUP}/{HTTPROUTE_VERSION}",
        "kind": HTTPROUTE_KIND,
        "metadata": {"name": "chat", "namespace": namespace},
        "spec": {"parentRefs": [PARENT]},
    }
    kubeapi.apply(
        custom.patch_namespaced_custom_object,
        HTTPROUTE_GROUP,
        HTTPROUTE_VERSION,
        namespace,
        HTTPROUTE_PLURAL,
        "chat",
        body=theirs,
        force=False,
        field_manager="platform-team",
    )
    policies.create("gw", route_spec("chat", vllm))
    # The policy starts on the fastest pool and climbs to the large one once the queue has
    # stayed empty for the cooldown; the API server accepts its rules under the CRD's schema.
    idle = wait_weights(custom, namespace, "chat", {"qwen-large-pool": 1000.0}, 30)
    assert idle["spec"]["parentRefs"][0]["name"] == PARENT["name"]
    managers = {m["manager"] for m in idle["metadata"]["managedFields"]}
    assert {WEIGHTS_FIELD_MANAGER, "platform-team"} <= managers
    # The load: the waiting requests pile up; the weights go to the small pool.
    VllmMetrics.waiting = BUSY
    wait_weights(custom, namespace, "chat", {"qwen-small-pool": 1000.0}, 10)
    VllmMetrics.waiting = 0
    wait_weights(custom, namespace, "chat", {"qwen-large-pool": 1000.0}, 15)
    large = compile_policy(policies.get("gw")["spec"], generation=None).plan.names[1]
    # The status is written just after the route: wait for it rather than read between the two.
    status = wait_for(
        lambda: (s := policies.status("gw"))["active"]["name"] == large and s,
        10,
        f"status.active to be {large}",
        0.1,
    )
    assert condition(status, "Ready")["status"] == "True"
    # Deleted: nothing deletes the route, its weights and parents stay.
    policies.delete_all()
    policies.created.clear()
    time.sleep(2)
    left = _route(custom, namespace, "chat")
    assert left is not None
    assert applied_backend_weights(left, POOL_GROUP) == {"qwen-large-pool": 1000.0}
    assert left["spec"]["parentRefs"][0]["name"] == PARENT["name"]
