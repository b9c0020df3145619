"""The profiling Job over several pods (issue 44 item 3), as the Jobs' ServiceAccount under its
generation's Role and the real API server's RBAC.

It lists the EndpointSlices of the workflow's Service: every ready pod, once, at its gRPC port;
a pod not ready, another Service's pods, a Service of another namespace and a hand-made slice's
addresses that are no Pod of the namespace at that IP are not measured on.
Without the Role's list rule (a Role an older operator made), it profiles on the Service's one
address and says why. Over two real rag-sim tritonservers, a retried pod takes what an earlier
one measured from the state and measures only the rest; past spec.profiling.maxSeconds (from its
first pod's start) it stops at once, saying how far it got.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster, wait_for
from e2e_shared import Workflows
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.meta import GROUP, VERSION
from compass.commands import job, job_profile, job_triton
from compass.controllers import kubeapi
from compass.controllers.builders import (
    PARTIAL_STARTED_FIELD,
    PROFILE_PARTIAL_KEY,
    PROFILE_PROGRESS_KEY,
    PROFILES_KEY,
    RESULT_KEY,
    build_job_role,
    build_job_role_binding,
    build_job_service_account,
    build_state_config_maps,
)
from compass.controllers.workflow_spec import validate_spec
from compass.dataplane.fleet import Endpoint
from compass.dataplane.profiler import FULL_PASS, ProfileSettings, measurement_key
from compass.dataplane.triton import TritonRouter
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import (
    FASTEST,
    PAPER_FRONT,
    RAG_CORNER_SPACE,
    TEST_TIME_SCALE,
    rag_sim_triton,
)
from tiers import require_tritonserver

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


def _pod_at(k8s_api: Any, namespace: str, name: str, ip: str) -> None:
    """A Pod holding ``ip`` as the kubelet would report it (bound to a node that never runs it:
    only its status.podIP matters here)."""
    core = client.CoreV1Api(k8s_api)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "triton", "image": "triton"}]},
    }
    core.create_namespaced_pod(namespace, body, _preload_content=False)
    status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}
    core.patch_namespaced_pod_status(name, namespace, status, _preload_content=False)


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


def _as_job(
    k8s_api: Any,
    k8s_cluster: Cluster,
    namespace: str,
    body: dict[str, Any],
    data: dict[str, str] | None = None,
) -> tuple[CompoundWorkflowSpec, str, Any]:
    """A real workflow, its generation's state (with ``data``), the Jobs' ServiceAccount bound
    to its Role; the spec, the state's name and an API client acting as the Jobs' pods, once
    RBAC lets them read their state."""
    core = client.CoreV1Api(k8s_api)
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    flows = Workflows(k8s_api, namespace)
    flows.create(body)
    workflow = flows.get(body["metadata"]["name"])
    core.create_namespaced_service_account(
        namespace, build_job_service_account(workflow, ACCOUNT), _preload_content=False
    )
    spec, _ = validate_spec(workflow["spec"])
    [state_body] = build_state_config_maps(workflow, spec)
    state_body["data"].update(data or {})
    stored = k8s_api.sanitize_for_serialization(
        core.create_namespaced_config_map(namespace, state_body)
    )
    rbac.create_namespaced_role(namespace, build_job_role(stored, spec), _preload_content=False)
    rbac.create_namespaced_role_binding(
        namespace, build_job_role_binding(stored, ACCOUNT), _preload_content=False
    )
    as_job = k8s_cluster.api_client(impersonate=f"system:serviceaccount:{namespace}:{ACCOUNT}")
    state = state_body["metadata"]["name"]
    refusals: list[str] = []

    def allowed() -> bool:
        try:
            kubeapi.call(client.CoreV1Api(as_job).read_namespaced_config_map, state, namespace)
            kubeapi.list_endpoint_slices(as_job, namespace, "rag")
        except ApiException as error:
            refusals.append(f"{error.status} {error.reason}")
            return False
        return True

    try:
        wait_for(allowed, 30, "the RoleBinding to take effect")
    except TimeoutError as error:
        raise AssertionError(f"{error}: {refusals[-3:]}") from None
    return spec, state, as_job


def test_the_profiling_job_lists_its_services_ready_pods_under_its_role(
    k8s_api: Any,
    k8s_cluster: Cluster,
    k8s_namespace: str,
    crds: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COMPASS_TRITON_ADDRESS", raising=False)
    rag = [("rag-b", "10.1.0.2", True), ("rag-a", "10.1.0.1", True), ("rag-c", "10.1.0.3", False)]
    for pod, ip, _ in [*rag, ("other-a", "10.2.0.1", True)]:
        _pod_at(k8s_api, k8s_namespace, pod, ip)
    # A hand-made slice with the Service's label: another namespace's pod, and one of this
    # namespace's pods at an address it does not hold. Neither is measured, and the source
    # says why.
    forged = _slice(
        "rag-forged", "rag", [("victim", "10.9.0.9", True), ("rag-a", "10.9.0.8", True)]
    )
    forged["endpoints"][0]["targetRef"]["namespace"] = "other"
    for body in (
        _slice("rag-1", "rag", rag[:2]),
        _slice("rag-2", "rag", rag[2:]),
        _slice("other-1", "other", [("other-a", "10.2.0.1", True)]),
        forged,
    ):
        k8s_cluster.request(
            f"/apis/discovery.k8s.io/v1beta1/namespaces/{k8s_namespace}/endpointslices",
            "POST",
            body,
        )
    spec, _, as_job = _as_job(k8s_api, k8s_cluster, k8s_namespace, _workflow("spread", "rag"))

    pods, source = job_triton.triton_pods(spec, k8s_namespace, as_job)
    assert pods == [
        Endpoint("rag-a", "10.1.0.1:8001", None),
        Endpoint("rag-b", "10.1.0.2:8001", None),
    ]
    assert source.startswith(
        f"the ready pods of Service rag; left out, not Pods of {k8s_namespace}"
    )
    assert f"10.9.0.8 (rag-a): in namespace {k8s_namespace} this address is no Pod's" in source
    assert "10.9.0.9 (victim): a Pod of namespace other" in source

    # A staging Service to measure (spec.triton.evaluationService): its ready pods instead.
    staging = spec.model_copy(
        update={"triton": spec.triton.model_copy(update={"evaluation_service": "other"})}
    )
    pods, source = job_triton.triton_pods(staging, k8s_namespace, as_job)
    assert pods == [Endpoint("other-a", "10.2.0.1:8001", None)]
    assert source == "the ready pods of Service other"

    # A Service in another namespace: its one address, and why.
    elsewhere = spec.model_copy(
        update={"triton": spec.triton.model_copy(update={"service": "rag.other.svc"})}
    )
    pods, source = job_triton.triton_pods(elsewhere, k8s_namespace, as_job)
    assert [p.grpc_url for p in pods] == ["rag.other.svc:8001"]
    assert "in another namespace" in source

    # A ServiceAccount without the list rule (a Role an older operator made): the Service's
    # address, and the API server's refusal in the reason.
    stranger = k8s_cluster.api_client(impersonate=f"system:serviceaccount:{k8s_namespace}:default")
    pods, source = job_triton.triton_pods(spec, k8s_namespace, stranger)
    assert [p.grpc_url for p in pods] == [f"rag.{k8s_namespace}.svc:8001"]
    assert "could not be read (HTTP 403" in source


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalTriton]]:
    """Two rag-sim tritonservers: the profiling's two pods (the override names both)."""
    require_tritonserver()
    servers: list[LocalTriton] = []
    try:
        for index in range(2):
            where = tmp_path_factory.mktemp(f"rag-{index}")
            servers.append(rag_sim_triton(where, TEST_TIME_SCALE, FASTEST).start(where))
        yield servers
    finally:
        for server in servers:
            server.stop()


def _served(server: LocalTriton) -> int:
    """Requests the server's router model has served (Triton's own statistics)."""
    router = TritonRouter(server.grpc_url)
    try:
        stats = router.client.get_inference_statistics(model_name=router.model, as_json=True)
    finally:
        router.close()
    return sum(int(m.get("inference_count", 0)) for m in stats.get("model_stats", []))


def test_a_retried_profiling_pod_resumes_and_a_bound_passed_stops_it(
    k8s_api: Any,
    k8s_cluster: Cluster,
    k8s_namespace: str,
    crds: None,
    two_servers: list[LocalTriton],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`compass job profile` over two real servers, as the Jobs' ServiceAccount: a
    configuration a killed pod measured (in the state) is taken as it was and not requested
    again, the others are spread over both servers, and the state ends with the profiles in the
    result's order, its progress done and the partial measurements gone. Then, its maxSeconds
    passed since its first pod started, the Job sends nothing, fails with the bound, how far it
    got and the fix, and the state's progress says so."""
    configs = list(PAPER_FRONT)
    result = {
        "feasible": [{"config": c, "accuracy": 0.9 - 0.01 * i} for i, c in enumerate(configs)]
    }
    earlier = {
        "config": configs[0],
        "latency_mean_ms": 25.0,
        "latency_p50_ms": 24.0,
        "latency_p95_ms": 30.0,
        "latency_p99_ms": 31.0,
        "latency_std_ms": 2.0,
        "warmup_runs": 1,
        "measurement_runs": 6,
        "pod": "an-earlier-pod",
    }
    partial = {
        PARTIAL_STARTED_FIELD: time.time(),
        "entries": {measurement_key(configs[0], FULL_PASS): earlier},
    }
    body = _workflow("resumed", "rag")
    body["spec"]["profiling"] = {"warmupRuns": 1, "measuredRuns": 6, "maxSeconds": 600}
    data = {RESULT_KEY: json.dumps(result), PROFILE_PARTIAL_KEY: json.dumps(partial)}
    _, state, as_job = _as_job(k8s_api, k8s_cluster, k8s_namespace, body, data)
    monkeypatch.setattr(kubeapi, "load_client", lambda *_: as_job)
    monkeypatch.setenv("COMPASS_TRITON_ADDRESS", ",".join(s.grpc_url for s in two_servers))
    before = [_served(s) for s in two_servers]

    assert job_profile.run_profile(state, k8s_namespace) == 0
    log = capsys.readouterr().out
    assert "on 2 pod(s) (COMPASS_TRITON_ADDRESS); 1 measurements reused" in log
    assert re.search(r"profiling: latency 4/4 on 2 pod\(s\), [\d.]+ configs/min", log), log
    served = [_served(s) - b for s, b in zip(two_servers, before, strict=True)]
    assert all(count > 0 for count in served), served
    # Each pod's warm-up, then 1 + 6 requests for each configuration not reused.
    assert sum(served) == 2 * ProfileSettings().pod_warmup_runs + 3 * (1 + 6)
    core = client.CoreV1Api(k8s_api)
    after = core.read_namespaced_config_map(state, k8s_namespace).data or {}
    profiles = json.loads(after[PROFILES_KEY])["profiles"]
    assert [p["config"] for p in profiles] == configs
    assert {k: v for k, v in profiles[0].items() if k != "accuracy"} == earlier
    assert {p["pod"] for p in profiles[1:]} == {s.grpc_url for s in two_servers}
    assert PROFILE_PARTIAL_KEY not in after
    assert json.loads(after[PROFILE_PROGRESS_KEY])["phase"] == "done"

    # Its first pod started 700 s ago: past maxSeconds 600, the next pod stops at once.
    late = {PARTIAL_STARTED_FIELD: time.time() - 700, "entries": partial["entries"]}
    core.patch_namespaced_config_map(
        state,
        k8s_namespace,
        {"data": {PROFILES_KEY: None, PROFILE_PARTIAL_KEY: json.dumps(late)}},
    )
    before = [_served(s) for s in two_servers]
    monkeypatch.setenv("COMPASS_NAMESPACE", k8s_namespace)
    assert job.main("profile", state) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("compass job profile: ProfilingTimeLimitError: profiling stopped at")
    assert "bound of 600 s (spec.profiling.maxSeconds) with 1 of 4 measurements done" in last
    assert "raise spec.profiling.maxSeconds" in last
    assert [_served(s) for s in two_servers] == before
    after = core.read_namespaced_config_map(state, k8s_namespace).data or {}
    stopped = json.loads(after[PROFILE_PROGRESS_KEY])
    assert stopped["phase"] == "stopped"
    assert "with 1 of 4 measurements done" in stopped["message"]
    assert PROFILES_KEY not in after
