"""Helpers shared by the k8s tier's controller tests and the e2e tier (tests/e2e).

The CRDs from crds/, readers of CompoundWorkflows and ParetoPolicies that wait with useful
failure output, and ParetoPolicy specs over rag-sim's front. Moved here from
test_workflow_controller.py, test_policy_controller.py and test_triton_pods.py so that the tests
import them instead of copying them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import Cluster, wait_for
from kubernetes import client

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.controllers import kubeapi
from compass.controllers.ledgerchunks import CHUNK_OF_LABEL
from compass.controllers.policy_compile import compile_policy
from compass.dataplane.triton import TritonRouter
from compass.domain.space import config_key
from compass_dev.clusterdemo import condition
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import ACCURATE, FASTEST

REPO = Path(__file__).resolve().parents[2]


def install_crds(cluster: Cluster) -> None:
    """The compass.io CRDs from crds/ (what `compass crds` generates), established."""
    # kubectl 1.20 validates a CRD against its own schema, which predates the CEL rules
    # (x-kubernetes-validations, 1.25+) and rejects the file; the 1.20 API server itself accepts
    # it and drops the rules, as it does for the kubernetes client's create.
    cluster.kubectl("apply", "--validate=false", "-f", str(REPO / "crds"))
    for plural in (WORKFLOW_PLURAL, POLICY_PLURAL):
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=30s", f"crd/{plural}.{GROUP}"
        )


def json_data(response: Any) -> Any:
    """The decoded body of a response read with _preload_content=False."""
    return json.loads(response.data)


@dataclass
class Policies:
    """ParetoPolicies in the module's namespace, deleted (and waited for) after each test."""

    api: client.CustomObjectsApi
    core: client.CoreV1Api
    namespace: str
    created: list[str] = field(default_factory=list)

    def create(
        self, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None
    ) -> None:
        metadata: dict[str, Any] = {"name": name}
        if annotations:
            metadata["annotations"] = annotations
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ParetoPolicy",
            "metadata": metadata,
            "spec": spec,
        }
        # kubeapi.NotFoundError while the resource is not served; other refusals as they are.
        kubeapi.call(
            self.api.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            POLICY_PLURAL,
            body,
        )
        self.created.append(name)

    def get(self, name: str) -> dict[str, Any]:
        return dict(
            kubeapi.call(
                self.api.get_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                POLICY_PLURAL,
                name,
            )
        )

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.api.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            POLICY_PLURAL,
            name,
            {"spec": spec},
            _preload_content=False,
        )

    def annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        """Set (or, with None, remove) annotations, as kubectl annotate does."""
        self.api.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            POLICY_PLURAL,
            name,
            {"metadata": {"annotations": annotations}},
            _preload_content=False,
        )

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        response = self.core.list_namespaced_event(
            self.namespace,
            field_selector=f"involvedObject.name={name},reason={reason}",
            _preload_content=False,
        )
        return list(json.loads(response.data)["items"])

    def wait_events(self, name: str, reason: str, count: int = 1) -> list[dict[str, Any]]:
        """At least ``count`` Events (kopf posts them in the background, a moment later)."""

        def enough() -> list[dict[str, Any]] | None:
            found = self.events(name, reason)
            return found if len(found) >= count else None

        return list(wait_for(enough, 10, f"{count} {reason} Event(s) on {name}"))

    def delete_all(self) -> None:
        where = (GROUP, VERSION, self.namespace, POLICY_PLURAL)
        for name in self.created:
            kubeapi.delete(self.api.delete_namespaced_custom_object, *where, name)
        # The operator removes its finalizer once the timer has stopped.
        wait_for(
            lambda: all(
                kubeapi.read(self.api.get_namespaced_custom_object, *where, n) is None
                for n in self.created
            ),
            30,
            "the policies to go",
        )


class Workflows:
    """Reads and writes CompoundWorkflows of one namespace; waits with useful failure output."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = json_data(
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, WORKFLOW_PLURAL, body, _preload_content=False
            )
        )
        return created

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json_data(
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, WORKFLOW_PLURAL, name, _preload_content=False
            )
        )
        return found

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            WORKFLOW_PLURAL,
            name,
            {"spec": spec},
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        return condition(self.get(name).get("status", {}), type_) or None

    def _listed(self, list_namespaced: Any, selector: str) -> list[dict[str, Any]]:
        """The items of a namespaced list call with this label selector."""
        items: list[dict[str, Any]] = json_data(
            list_namespaced(self.namespace, label_selector=selector, _preload_content=False)
        )["items"]
        return items

    def jobs(self, name: str) -> list[dict[str, Any]]:
        return self._listed(self.batch.list_namespaced_job, f"compass.io/workflow={name}")

    def config_maps(self, name: str) -> list[dict[str, Any]]:
        return self._listed(self.core.list_namespaced_config_map, f"compass.io/workflow={name}")

    def state_config_map(self, name: str) -> dict[str, Any]:
        """The workflow's one state ConfigMap (its ledger chunks, labelled, lie beside it)."""
        [state] = [
            c
            for c in self.config_maps(name)
            if CHUNK_OF_LABEL not in (c["metadata"].get("labels") or {})
        ]
        return state

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items = self._listed(self.core.list_namespaced_pod, selector)
        return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])

    def policy(self, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = kubeapi.read(
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            POLICY_PLURAL,
            name,
        )
        return found

    def events(self, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the workflow's Events, oldest first."""
        items = json_data(
            self.core.list_namespaced_event(
                self.namespace,
                field_selector=f"involvedObject.name={name},involvedObject.kind=CompoundWorkflow",
                _preload_content=False,
            )
        )["items"]
        # Creation order: timestamps have a resolution of one second, revisions do not.
        items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return [(e["type"], e["reason"], e["message"]) for e in items]

    def wait_events(self, name: str, reasons: list[str], timeout_s: float = 15) -> None:
        """Wait until the workflow's Events have exactly these reasons, in this order.

        kopf posts Events from a queue: wait for them while the operator runs.
        """
        try:
            wait_for(lambda: event_reasons(self.events(name)) == reasons, timeout_s, "the Events")
        except TimeoutError:
            assert self.events(name) == reasons  # shows what was posted instead

    def wait(
        self, name: str, check: Callable[[dict[str, Any]], Any], timeout_s: float, what: str
    ) -> Any:
        """Poll the workflow until check(workflow) is truthy; on timeout, show what is there."""
        try:
            return wait_for(lambda: check(self.get(name)), timeout_s, what, interval_s=0.2)
        except TimeoutError as error:
            jobs = [(j["metadata"]["name"], j.get("status")) for j in self.jobs(name)]
            raise AssertionError(
                f"{error}\nstatus: {json.dumps(self.get(name).get('status'), indent=1)}\n"
                f"jobs: {jobs}\nevents: {self.events(name)}"
            ) from None


def phase_is(phase: str, generation: int = 1) -> Callable[[dict[str, Any]], bool]:
    """A check that the workflow is in this phase for this generation."""

    def check(workflow: dict[str, Any]) -> bool:
        status = workflow.get("status") or {}
        return status.get("phase") == phase and status.get("observedGeneration") == generation

    return check


def event_reasons(events: list[tuple[str, str, str]]) -> list[str]:
    """The reasons of (type, reason, message) Events."""
    return [reason for _, reason, _ in events]


# ---------------------------------------------------------------------------- rag-sim policies


def front() -> list[dict[str, Any]]:
    """rag-sim's fastest and most accurate configurations, as measured through the router here
    (rag_sim.json's profiles scaled by TEST_TIME_SCALE, plus ~7 ms of gRPC and BLS overhead)."""
    return [
        {"config": FASTEST, "accuracy": 0.8318, "latencyMeanMs": 20.5, "latencyP95Ms": 23.0},
        {"config": ACCURATE, "accuracy": 0.8604, "latencyMeanMs": 33.5, "latencyP95Ms": 37.5},
    ]


def _names_in_status() -> tuple[str, str]:
    """FASTEST's and ACCURATE's names as the status gives them: the operator's plan names for
    the front as the API server hands it over (a custom object's keys come back sorted)."""
    served = json.loads(json.dumps(front(), sort_keys=True))
    spec = {"front": served, "slo": {"latencyMs": 150}, "routing": {"grpcEndpoint": "r:8001"}}
    fast, accurate = compile_policy(spec, generation=None).plan.names
    return fast, accurate


FAST_NAME, ACCURATE_NAME = _names_in_status()


def _rag_sim_policy(routing: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A spec over front(): SLO 150 ms, so ACCURATE may stay with <= 3 requests queued and be
    entered with <= 2 (after 2 s of an empty queue); cooldowns of a couple of seconds."""
    spec: dict[str, Any] = {
        "front": front(),
        "slo": {"latencyMs": 150, "percentile": 95},
        "hysteresis": {
            "upscaleCooldownSeconds": 0,
            "downscaleCooldownSeconds": 2,
            "cooldownExponent": 0,
            "slackBufferMs": 20,
        },
        "routing": routing,
        "intervalSeconds": 1,
    }
    spec.update(overrides)
    return spec


def policy_spec(triton: LocalTriton, **overrides: Any) -> dict[str, Any]:
    """A spec for the test Triton: its router over gRPC, its queue from its own /metrics."""
    spec = _rag_sim_policy(
        {"grpcEndpoint": triton.grpc_url, "routerModel": "router"},
        metrics={"type": "triton", "url": triton.metrics_url},
    )
    spec.update(overrides)
    return spec


def service_policy_spec(service: str) -> dict[str, Any]:
    """A spec over the pods behind ``service``: no spec.metrics, so the operator reads each
    pod's /metrics on its metrics port."""
    return _rag_sim_policy({"service": service, "grpcPort": "grpc", "metricsPort": "metrics"})


def wait_active(
    policies: Policies, name: str, router: TritonRouter, config: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """The policy's status once both the router and the status show this configuration."""

    def both() -> dict[str, Any] | None:
        if router.active_config() != config_key(config):
            return None
        status = policies.status(name)
        active = (status.get("active") or {}).get("config")
        return status if active is not None and config_key(active) == config_key(config) else None

    wanted = config["generator_model"]
    return dict(wait_for(both, timeout_s, f"{name} to serve {wanted}", 0.1))
