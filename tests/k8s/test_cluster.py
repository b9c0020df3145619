"""The k8s tier's infrastructure works: a real API server, real controllers, a node that runs pods.

Each test states one thing later tests rely on: authorization is really enforced (RBAC), CRD
schemas really validate, Jobs really complete and fail through the real job controller with the
node helper running their pods, and ownerReferences really garbage-collect.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cluster import Cluster, crd_established, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass_dev.devnode import Node

# The job controller's back-off between a failed pod and its replacement starts at 10 s (1.20).
JOB_TIMEOUT_S = 60


def _data(response: Any) -> Any:
    """The JSON body of a call made with _preload_content=False."""
    return json.loads(response.data)


def _job(name: str, container: dict[str, Any], backoff_limit: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", **container}]}
            },
        },
    }


def _job_condition(batch: client.BatchV1Api, namespace: str, name: str) -> dict[str, Any] | None:
    """The Job's Complete or Failed condition once it has one."""
    job = _data(batch.read_namespaced_job_status(name, namespace, _preload_content=False))
    for condition in job.get("status", {}).get("conditions") or []:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return {**condition, "job": job}
    return None


def _wait_for_job(api: Any, namespace: str, name: str, node: Node) -> dict[str, Any]:
    """The Job's final condition; on a timeout, everything needed to see why."""
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    try:
        return wait_for(
            lambda: _job_condition(batch, namespace, name), JOB_TIMEOUT_S, f"Job {name} to end"
        )
    except TimeoutError as error:
        job = _data(batch.read_namespaced_job_status(name, namespace, _preload_content=False))
        pods = [
            (p["metadata"]["name"], p["spec"].get("nodeName"), p.get("status"))
            for p in _pods(core, namespace, f"job-name={name}")
        ]
        raise AssertionError(
            f"{error}\njob status: {job.get('status')}\npods: {pods}\nnode errors: {node.errors}"
        ) from None


def _pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[dict[str, Any]]:
    pods = _data(
        core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    )
    return sorted(pods["items"], key=lambda p: p["metadata"]["creationTimestamp"])


def test_api_server_answers_and_kubectl_applies(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    """/version says 1.20.2; kubectl (built from the same tree) applies a manifest."""
    assert k8s_cluster.request("/version")["gitVersion"] == "v1.20.2"
    manifest = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hello"}, "data": {"a": "1"}}
    )
    args = ("apply", "-n", k8s_namespace, "-f", "-")
    assert k8s_cluster.kubectl(*args, input=manifest).stdout.strip() == "configmap/hello created"
    assert k8s_cluster.kubectl(*args, input=manifest).stdout.strip() == "configmap/hello unchanged"


def test_rbac_is_enforced(k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str) -> None:
    """A service account may not list pods until a Role and RoleBinding allow it."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    authz = client.AuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(
        k8s_namespace, {"metadata": {"name": "robot"}}, _preload_content=False
    )
    user = f"system:serviceaccount:{k8s_namespace}:robot"
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{k8s_namespace}"],
            "resourceAttributes": {"namespace": k8s_namespace, "verb": "list", "resource": "pods"},
        },
    }

    def allowed() -> bool:
        answer = _data(authz.create_subject_access_review(review, _preload_content=False))
        return bool(answer["status"].get("allowed"))

    as_robot = client.CoreV1Api(k8s_cluster.api_client(impersonate=user))
    assert not allowed()
    with pytest.raises(ApiException) as forbidden:
        as_robot.list_namespaced_pod(k8s_namespace, _preload_content=False)
    assert forbidden.value.status == 403
    assert "cannot list resource" in str(forbidden.value.body)

    rbac.create_namespaced_role(
        k8s_namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
        _preload_content=False,
    )
    rbac.create_namespaced_role_binding(
        k8s_namespace,
        {
            "metadata": {"name": "robot-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": k8s_namespace}],
        },
        _preload_content=False,
    )
    wait_for(allowed, 10, "the RoleBinding to take effect")
    assert _data(as_robot.list_namespaced_pod(k8s_namespace, _preload_content=False))["items"] == []
    with pytest.raises(ApiException) as still_forbidden:
        as_robot.delete_collection_namespaced_pod(k8s_namespace, _preload_content=False)
    assert still_forbidden.value.status == 403


def test_crd_structural_schema_validates(k8s_api: Any, k8s_namespace: str) -> None:
    """A structural schema is accepted; a violating object is rejected naming its fields."""
    extensions = client.ApiextensionsV1Api(k8s_api)
    custom = client.CustomObjectsApi(k8s_api)
    group, plural = "k8s-tier.compass.io", f"widgets{abs(hash(k8s_namespace)) % 10000}"
    crd_name = f"{plural}.{group}"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["mode"],
                "properties": {
                    "mode": {"type": "string", "enum": ["fast", "accurate"]},
                    "replicas": {"type": "integer", "minimum": 1},
                },
            }
        },
    }
    extensions.create_custom_resource_definition(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": crd_name},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": plural[:-1], "kind": "Widget"},
                "versions": [
                    {
                        "name": "v1alpha1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": schema},
                    }
                ],
            },
        },
        _preload_content=False,
    )
    try:
        wait_for(
            lambda: crd_established(k8s_api, crd_name), 20, f"CRD {crd_name} to be established"
        )

        def create(name: str, spec: dict[str, Any]) -> Any:
            body = {
                "apiVersion": f"{group}/v1alpha1",
                "kind": "Widget",
                "metadata": {"name": name},
                "spec": spec,
            }
            return custom.create_namespaced_custom_object(
                group, "v1alpha1", k8s_namespace, plural, body, _preload_content=False
            )

        # Served as soon as discovery has it (a moment after Established).
        ok = wait_for(
            lambda: _try(lambda: create("good", {"mode": "fast", "replicas": 2, "extra": 1})),
            20,
            "the custom resource to be served",
        )
        created = _data(ok)
        assert created["spec"] == {"mode": "fast", "replicas": 2}, "unknown fields are pruned"

        with pytest.raises(ApiException) as rejected:
            create("bad", {"mode": "turbo", "replicas": 0})
        assert rejected.value.status == 422
        message = json.loads(rejected.value.body)["message"]
        assert "spec.mode" in message
        assert "spec.replicas" in message
        with pytest.raises(ApiException) as missing:
            create("incomplete", {"replicas": 3})
        assert missing.value.status == 422
        assert "spec.mode: Required value" in json.loads(missing.value.body)["message"]
    finally:
        extensions.delete_custom_resource_definition(crd_name, _preload_content=False)


def _try(call: Any) -> Any:
    """call()'s result, or None on 404 (not served yet)."""
    try:
        return call()
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def test_job_completes_through_the_job_controller(
    k8s_api: Any, k8s_namespace: str, k8s_node: Node
) -> None:
    """The job controller creates a pod, the node runs it, the Job becomes Complete."""
    batch, core = client.BatchV1Api(k8s_api), client.CoreV1Api(k8s_api)
    container = {
        "image": "busybox:1.36",
        "command": ["sh", "-c"],
        "args": ['echo "hello from $(POD_NAME) with $GREETING"'],
        "env": [
            {"name": "GREETING", "value": "env"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
    }
    batch.create_namespaced_job(k8s_namespace, _job("hello", container), _preload_content=False)

    condition = _wait_for_job(k8s_api, k8s_namespace, "hello", k8s_node)
    assert condition["type"] == "Complete", condition
    assert condition["job"]["status"]["succeeded"] == 1
    [pod] = _pods(core, k8s_namespace, "job-name=hello")
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == k8s_node.name
    assert pod["status"]["phase"] == "Succeeded"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert terminated["message"] == f"hello from {name} with env"
    assert k8s_node.log(k8s_namespace, name) == f"hello from {name} with env\n"


def test_job_runs_the_compass_image_locally(
    k8s_api: Any, k8s_namespace: str, k8s_node: Node
) -> None:
    """The image `compass-operator` runs the venv's `compass` (the node's image hook)."""
    batch = client.BatchV1Api(k8s_api)
    container = {"image": "ghcr.io/example/compass-operator:dev", "args": ["--help"]}
    batch.create_namespaced_job(k8s_namespace, _job("cli", container), _preload_content=False)
    condition = _wait_for_job(k8s_api, k8s_namespace, "cli", k8s_node)
    assert condition["type"] == "Complete", condition
    [pod] = _pods(client.CoreV1Api(k8s_api), k8s_namespace, "job-name=cli")
    assert "usage: compass" in k8s_node.log(k8s_namespace, pod["metadata"]["name"])


def test_failing_job_retries_then_fails(k8s_api: Any, k8s_namespace: str, k8s_node: Node) -> None:
    """A failing command is retried backoffLimit times, then the Job is Failed; the message stays."""
    batch, core = client.BatchV1Api(k8s_api), client.CoreV1Api(k8s_api)
    container = {
        "image": "busybox:1.36",
        "command": ["sh", "-c", "echo starting; echo 'boom: no such dataset' >&2; exit 3"],
    }
    batch.create_namespaced_job(
        k8s_namespace, _job("boom", container, backoff_limit=1), _preload_content=False
    )

    condition = _wait_for_job(k8s_api, k8s_namespace, "boom", k8s_node)
    assert condition["type"] == "Failed", condition
    assert condition["reason"] == "BackoffLimitExceeded"
    # backoffLimit 1: one retry. (1.20's job controller may start one more pod when a failure
    # lands while it syncs; that is the real controller's behaviour, not the node's.)
    failed = condition["job"]["status"]["failed"]
    assert failed in (2, 3), condition
    pods = _pods(core, k8s_namespace, "job-name=boom")
    assert len(pods) == failed
    for pod in pods:
        assert pod["status"]["phase"] == "Failed"
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 3
        assert terminated["reason"] == "Error"
        assert terminated["message"] == "starting\nboom: no such dataset"


def test_deleting_an_owner_collects_its_dependents(k8s_api: Any, k8s_namespace: str) -> None:
    """The real garbage collector deletes a ConfigMap whose owner is deleted."""
    core = client.CoreV1Api(k8s_api)
    owner = _data(
        core.create_namespaced_config_map(
            k8s_namespace, {"metadata": {"name": "owner"}}, _preload_content=False
        )
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    for name, references in (("owned", [reference]), ("bystander", [])):
        core.create_namespaced_config_map(
            k8s_namespace,
            {"metadata": {"name": name, "ownerReferences": references}},
            _preload_content=False,
        )

    core.delete_namespaced_config_map("owner", k8s_namespace, _preload_content=False)

    def collected() -> bool:
        names = {
            c["metadata"]["name"]
            for c in _data(core.list_namespaced_config_map(k8s_namespace, _preload_content=False))[
                "items"
            ]
        }
        return "owned" not in names

    wait_for(collected, 30, "the garbage collector to delete the owned ConfigMap")
    core.read_namespaced_config_map("bystander", k8s_namespace, _preload_content=False)


def test_job_deadline_kills_the_running_pod(
    k8s_api: Any, k8s_namespace: str, k8s_node: Node
) -> None:
    """activeDeadlineSeconds: the job controller deletes the pod; the node kills its process."""
    batch, core = client.BatchV1Api(k8s_api), client.CoreV1Api(k8s_api)
    job = _job("slow", {"image": "busybox:1.36", "command": ["sleep", "300"]})
    job["spec"]["activeDeadlineSeconds"] = 2
    batch.create_namespaced_job(k8s_namespace, job, _preload_content=False)

    condition = _wait_for_job(k8s_api, k8s_namespace, "slow", k8s_node)
    assert condition["type"] == "Failed", condition
    assert condition["reason"] == "DeadlineExceeded"
    # A kubelet finishes the graceful delete once the container is dead; so does the node.
    wait_for(lambda: not _pods(core, k8s_namespace, "job-name=slow"), 20, "the pod to be gone")


def test_on_failure_restarts_the_container_in_place(
    k8s_api: Any, k8s_namespace: str, k8s_node: Node
) -> None:
    """restartPolicy OnFailure: the same pod runs again (its directory kept) and the Job completes."""
    batch, core = client.BatchV1Api(k8s_api), client.CoreV1Api(k8s_api)
    script = "if [ -f tried ]; then echo second try; else touch tried; echo first try; exit 1; fi"
    job = _job("flaky", {"image": "busybox:1.36", "command": ["sh", "-c", script]}, 3)
    job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    batch.create_namespaced_job(k8s_namespace, job, _preload_content=False)

    condition = _wait_for_job(k8s_api, k8s_namespace, "flaky", k8s_node)
    assert condition["type"] == "Complete", condition
    [pod] = _pods(core, k8s_namespace, "job-name=flaky")
    [status] = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert status["lastState"]["terminated"]["message"] == "first try"
    assert status["state"]["terminated"]["message"] == "second try"
    assert k8s_node.log(k8s_namespace, pod["metadata"]["name"]) == "first try\nsecond try\n"
