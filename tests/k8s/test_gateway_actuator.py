"""The llm-d gateway as a policy's actuator, on the real API server with llm-d's own
InferenceModelRewrite CRD (tests/k8s/llm-d/): the policy's decisions move the rewrite's target
weights through a load change, as the same policy decides offline for the same queue; another
field manager's edit is reported, not overwritten; a deleted policy leaves its last weights.

The queue is a model server's /metrics giving vLLM's vllm:num_requests_waiting: a small HTTP
server here, which the test sets (no vLLM on this machine).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from cluster import Cluster, wait_for
from e2e_shared import Policies, condition
from kubernetes import client

from compass.api.gateway import REWRITE_GROUP, REWRITE_PLURAL, REWRITE_VERSION
from compass.controllers import kubeapi
from compass.controllers.gateway import WEIGHTS_FIELD_MANAGER, applied_weights
from compass.controllers.policy_compile import compile_policy
from compass.domain.elastico import Observation, PolicyState
from compass_dev.processes import QuietHandler, serve_http

LLMD_CRDS = Path(__file__).resolve().parent / "llm-d"
SMALL = {"model": "qwen-small", "max_tokens": 256}
LARGE = {"model": "qwen-large", "max_tokens": 256}
# Far past what the large model may queue under the 600 ms SLO (a few requests).
BUSY = 40


class VllmMetrics(QuietHandler):
    """A model server's /metrics: vLLM's waiting-requests gauge, as the test sets it."""

    waiting: ClassVar[float] = 0.0

    def do_GET(self) -> None:
        page = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="qwen-small"}} {self.waiting}\n'
            'vllm:num_requests_waiting{model_name="qwen-large"} 0.0\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)


@pytest.fixture(scope="module")
def llmd_crds(k8s_cluster: Cluster) -> None:
    """llm-d's InferenceModelRewrite CRD, established (cluster-wide: it stays)."""
    k8s_cluster.kubectl("apply", "--validate=false", "-f", str(LLMD_CRDS))
    k8s_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        f"crd/{REWRITE_PLURAL}.{REWRITE_GROUP}",
    )


@pytest.fixture
def vllm() -> Iterator[str]:
    """The model server's metrics URL, its queue empty."""
    VllmMetrics.waiting = 0.0
    with serve_http(VllmMetrics) as address:
        yield f"http://{address}/metrics"


def gateway_spec(rewrite: str, metrics_url: str) -> dict[str, Any]:
    """Two model variants behind one pool, written as the rewrite's weights; cooldowns of 2 s."""
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
        "routing": {
            "actuator": "inferenceModelRewrite",
            "modelRewrite": {"name": rewrite, "poolRef": {"name": "qwen-pool"}, "model": "chat"},
        },
        "metrics": {"type": "vllm", "url": metrics_url},
        "intervalSeconds": 1,
    }


def _rewrite(api: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    where = (REWRITE_GROUP, REWRITE_VERSION, namespace, REWRITE_PLURAL)
    found = kubeapi.read(api.get_namespaced_custom_object, *where, name)
    return None if found is None else dict(found)


def wait_weights(
    api: client.CustomObjectsApi,
    namespace: str,
    name: str,
    wanted: dict[str, float],
    timeout_s: float,
) -> dict[str, Any]:
    """The rewrite once its rule for "chat" has exactly these weights."""

    def shown() -> dict[str, Any] | None:
        found = _rewrite(api, namespace, name)
        return found if found is not None and applied_weights(found, "chat") == wanted else None

    return dict(wait_for(shown, timeout_s, f"{name}'s weights to be {wanted}", 0.1))


def test_a_policy_moves_the_rewrites_weights_with_the_load_and_leaves_them_when_deleted(
    k8s_api: Any, llmd_crds: None, policies: Policies, vllm: str
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    namespace = policies.namespace
    spec = gateway_spec("chat", vllm)
    policies.create("gw", spec)
    # No rewrite yet: the policy starts on the fastest, creates the rewrite, and climbs to the
    # large model once the queue has stayed empty for the cooldown.
    idle = wait_weights(custom, namespace, "chat", {"qwen-large": 1000.0}, 30)
    assert idle["spec"]["poolRef"]["name"] == "qwen-pool"
    managers = {m["manager"] for m in idle["metadata"]["managedFields"]}
    assert WEIGHTS_FIELD_MANAGER in managers
    # The load: the waiting requests pile up; the weights go to the small model.
    VllmMetrics.waiting = BUSY
    wait_weights(custom, namespace, "chat", {"qwen-small": 1000.0}, 10)
    # The same policy (as the API server hands it over), offline, decides the same for the
    # same observations.
    policy = compile_policy(policies.get("gw")["spec"], generation=None).policy
    names = policy.plan.names
    now = time.time()
    large = PolicyState(active=names[1], active_since=now - 60)
    decided, state = policy.decide(Observation(time=now, queue_depth=BUSY), large, now)
    assert state.active == names[0]
    assert decided.switched
    idle_state = PolicyState(active=names[0], active_since=now - 60)
    for t in (now, now + 1, now + 2.5):
        _, idle_state = policy.decide(Observation(time=t, queue_depth=0), idle_state, t)
    assert idle_state.active == names[1]
    # The load gone: back to the large model after the cooldown.
    VllmMetrics.waiting = 0
    wait_weights(custom, namespace, "chat", {"qwen-large": 1000.0}, 15)
    # The status is written just after the rewrite: wait for it rather than read between the two.
    status = wait_for(
        lambda: (s := policies.status("gw"))["active"]["name"] == names[1] and s,
        10,
        f"status.active to be {names[1]}",
        0.1,
    )
    assert condition(status, "Ready")["status"] == "True"
    # Deleted: nothing deletes the rewrite, and its weights stay as the policy left them.
    policies.delete_all()
    policies.created.clear()
    time.sleep(2)
    left = _rewrite(custom, namespace, "chat")
    assert left is not None
    assert applied_weights(left, "chat") == {"qwen-large": 1000.0}


def test_another_managers_weights_are_reported_and_left_alone(
    k8s_api: Any, llmd_crds: None, policies: Policies, vllm: str
) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    namespace = policies.namespace
    policies.create("held", gateway_spec("held", vllm))
    wait_weights(custom, namespace, "held", {"qwen-large": 1000.0}, 30)
    # A person (or another controller) applies weights of their own, taking the rules over.
    theirs = {
        "apiVersion": f"{REWRITE_GROUP}/{REWRITE_VERSION}",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": "held", "namespace": namespace},
        "spec": {
            "poolRef": {"name": "qwen-pool"},
            "rules": [
                {
                    "matches": [{"model": {"value": "chat"}}],
                    "targets": [
                        {"modelRewrite": "qwen-small", "weight": 50},
                        {"modelRewrite": "qwen-canary", "weight": 50},
                    ],
                }
            ],
        },
    }
    kubeapi.apply(
        custom.patch_namespaced_custom_object,
        REWRITE_GROUP,
        REWRITE_VERSION,
        namespace,
        REWRITE_PLURAL,
        "held",
        body=theirs,
        force=True,
        field_manager="canary-rollout",
    )

    def reported() -> dict[str, Any] | None:
        ready = condition(policies.status("held"), "Ready")
        return ready if ready and ready.get("reason") == "SwitchFailed" else None

    ready = wait_for(reported, 15, "the conflict to be reported", 0.2)
    assert ready["status"] == "False"
    assert "held by another field manager" in ready["message"]
    assert "canary-rollout" in ready["message"]
    events = [e["message"] for e in policies.wait_events("held", "SwitchFailed")]
    assert any("canary-rollout" in m for m in events), events
    # Not fought over: theirs stay, tick after tick.
    time.sleep(3)
    kept = _rewrite(custom, namespace, "held")
    assert kept is not None
    assert applied_weights(kept, "chat") == {"qwen-small": 50.0, "qwen-canary": 50.0}
