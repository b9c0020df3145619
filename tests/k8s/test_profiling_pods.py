"""The profiling Job finds the Triton pods it spreads its measurements over (issue 44 item 3).

As the Jobs' ServiceAccount under its generation's Role and the real API server's RBAC, the
Job's code lists the EndpointSlices of the workflow's Service: every ready pod, once, at its
gRPC port; a pod not ready, another Service's pods and a Service of another namespace are not
measured on. Without the Role's list rule (a Role an older operator made), it profiles on the
Service's one address and says why.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster import Cluster, wait_for
from e2e_shared import Workflows
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass.api.meta import GROUP, VERSION
from compass.commands import job
from compass.controllers import kubeapi
from compass.controllers.builders import (
    build_job_role,
    build_job_role_binding,
    build_job_service_account,
    build_state_config_maps,
)
from compass.controllers.workflow_spec import validate_spec
from compass.dataplane.fleet import Endpoint
from compass.lab.scenarios import RAG_CORNER_SPACE

ACCOUNT = "compass-job"


def _slice(name: str, service: str, endpoints: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """An EndpointSlice of ``service`` listing (pod, IP, ready) at the named port grpc=8001
    (discovery.k8s.io/v1beta1: the tier's Kubernetes 1.20 serves no v1)."""
    return {
        "apiVersion": "discovery.k8s.io/v1beta1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": 8001}, {"name": "metrics", "port": 8002}],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": pod},
            }
            for pod, ip, ready in endpoints
        ],
    }


def _workflow(name: str, service: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CompoundWorkflow",
        "metadata": {"name": name},
        "spec": {
            "space": RAG_CORNER_SPACE,
            "evaluation": {
                "dataset": {"size": 20, "imagePath": "/data/rag.jsonl"},
                "tau": 0.8,
                "evaluator": {"type": "replay", "replayConfigMap": "rag-ledger"},
            },
            "slo": {"latencyMs": 300},
            "triton": {"service": service},
        },
    }


def test_the_profiling_job_lists_its_services_ready_pods_under_its_role(
    k8s_api: Any,
    k8s_cluster: Cluster,
    k8s_namespace: str,
    crds: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COMPASS_TRITON_ADDRESS", raising=False)
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(
        k8s_namespace, build_job_service_account(k8s_namespace, ACCOUNT), _preload_content=False
    )
    rag = [("rag-b", "10.1.0.2", True), ("rag-a", "10.1.0.1", True), ("rag-c", "10.1.0.3", False)]
    for body in (
        _slice("rag-1", "rag", rag[:2]),
        _slice("rag-2", "rag", rag[2:]),
        _slice("other-1", "other", [("other-a", "10.2.0.1", True)]),
    ):
        k8s_cluster.request(
            f"/apis/discovery.k8s.io/v1beta1/namespaces/{k8s_namespace}/endpointslices",
            "POST",
            body,
        )
    flows = Workflows(k8s_api, k8s_namespace)
    flows.create(_workflow("spread", "rag"))
    workflow = flows.get("spread")
    spec, _ = validate_spec(workflow["spec"])
    [state_body] = build_state_config_maps(workflow, spec)
    stored = core.create_namespaced_config_map(k8s_namespace, state_body)
    stored_dict = k8s_api.sanitize_for_serialization(stored)
    rbac.create_namespaced_role(
        k8s_namespace, build_job_role(stored_dict, spec), _preload_content=False
    )
    rbac.create_namespaced_role_binding(
        k8s_namespace, build_job_role_binding(stored_dict, ACCOUNT), _preload_content=False
    )
    as_job = k8s_cluster.api_client(impersonate=f"system:serviceaccount:{k8s_namespace}:{ACCOUNT}")
    refusals: list[str] = []

    def allowed() -> bool:
        try:
            kubeapi.list_endpoint_slices(as_job, k8s_namespace, "rag")
        except ApiException as error:
            refusals.append(f"{error.status} {error.reason}")
            return False
        return True

    try:
        wait_for(allowed, 30, "the RoleBinding to take effect")
    except TimeoutError as error:
        raise AssertionError(f"{error}: {refusals[-3:]}") from None

    pods, source = job.profiling_pods(spec, k8s_namespace, as_job)
    assert pods == [
        Endpoint("rag-a", "10.1.0.1:8001", None),
        Endpoint("rag-b", "10.1.0.2:8001", None),
    ]
    assert source == "the ready pods of Service rag"

    # A Service in another namespace: its one address, and why.
    elsewhere = spec.model_copy(
        update={"triton": spec.triton.model_copy(update={"service": "rag.other.svc"})}
    )
    pods, source = job.profiling_pods(elsewhere, k8s_namespace, as_job)
    assert [p.grpc_url for p in pods] == ["rag.other.svc:8001"]
    assert "in another namespace" in source

    # A ServiceAccount without the list rule (a Role an older operator made): the Service's
    # address, and the API server's refusal in the reason.
    stranger = k8s_cluster.api_client(impersonate=f"system:serviceaccount:{k8s_namespace}:default")
    pods, source = job.profiling_pods(spec, k8s_namespace, stranger)
    assert [p.grpc_url for p in pods] == [f"rag.{k8s_namespace}.svc:8001"]
    assert "could not be read (HTTP 403" in source
