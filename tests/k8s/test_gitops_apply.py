"""The generated ParetoPolicy is server-side applied (field manager compass-operator), against a
real API server: field ownership is Kubernetes' behaviour, not ours.

A re-plan changes only the fields the operator owns: a person's spec.paused and labels survive,
a field the new plan no longer sets is removed, and a policy that an older operator wrote by
PUT (manager OpenAPI-Generator) is taken over so that holds for it too.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

import pytest
from kubernetes import client

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.controllers import kubeapi, workflow_plan
from compass.controllers.builders import GENERATION_LABEL, build_pareto_policy, planned_policy
from compass.controllers.workflow_handlers import _apply_policy

FRONT = [
    {
        "config": {"generator": "small"},
        "accuracy": 0.81,
        "latencyMeanMs": 20.0,
        "latencyP95Ms": 25.0,
    },
    {"config": {"generator": "big"}, "accuracy": 0.87, "latencyMeanMs": 30.0, "latencyP95Ms": 38.0},
]
METRICS = {"type": "triton", "url": "http://triton:8002/metrics"}


def _plan(slo_ms: float, **extra: Any) -> dict[str, Any]:
    """A planned ParetoPolicy spec as the workflow controller's plan writes it (paused too)."""
    return {
        "front": copy.deepcopy(FRONT),
        "slo": {"latencyMs": slo_ms, "percentile": 95.0},
        "routing": {"service": "triton", "grpcPort": 8001, "metricsPort": 8002},
        "paused": False,
        **extra,
    }


def _create_workflow(api: Any, namespace: str, name: str) -> dict[str, Any]:
    """A CompoundWorkflow (no operator runs here): a generated policy's owner."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CompoundWorkflow",
        "metadata": {"name": name},
        "spec": {
            "space": {"parameters": [{"name": "generator", "values": ["small", "big"]}]},
            "evaluation": {
                "dataset": {"size": 10, "imagePath": "/data/d.jsonl"},
                "tau": 0.8,
                "evaluator": {"type": "replay", "replayConfigMap": "ledger"},
            },
            "slo": {"latencyMs": 300},
            "triton": {"service": "triton"},
        },
    }
    created: dict[str, Any] = kubeapi.call(
        client.CustomObjectsApi(api).create_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        WORKFLOW_PLURAL,
        body,
    )
    return created


@pytest.fixture
def workflow(k8s_api: Any, namespace: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """This test's own workflow."""
    return _create_workflow(k8s_api, namespace, f"wf{abs(hash(request.node.name)) % 10**6}")


def _policy(api: Any, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubeapi.call(
        client.CustomObjectsApi(api).get_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        POLICY_PLURAL,
        name,
    )
    return found


def _as_person(api: Any, namespace: str, name: str, patch: dict[str, Any]) -> None:
    """What `kubectl edit` does: a merge patch under its own field manager."""
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, POLICY_PLURAL, name, patch, field_manager="kubectl-edit"
    )


def _managers(policy: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (e["manager"], e["operation"]): e.get("fieldsV1") or {}
        for e in policy["metadata"].get("managedFields") or []
    }


def test_a_persons_pause_and_label_survive_a_replan(
    k8s_api: Any, namespace: str, workflow: dict[str, Any]
) -> None:
    name = workflow["metadata"]["name"]
    applied = _apply_policy(k8s_api, workflow, 1, _plan(300.0))
    assert applied.action is workflow_plan.PolicyAction.APPLY
    first = _policy(k8s_api, namespace, name)
    assert ("compass-operator", "Apply") in _managers(first)
    # The operator never applies paused: the API server's default (false) is nobody's.
    assert "f:paused" not in _managers(first)[("compass-operator", "Apply")]["f:spec"]
    _as_person(
        k8s_api, namespace, name, {"metadata": {"labels": {"team": "a"}}, "spec": {"paused": True}}
    )

    _apply_policy(k8s_api, workflow, 2, _plan(250.0))

    policy = _policy(k8s_api, namespace, name)
    assert policy["spec"]["paused"] is True
    assert policy["spec"]["slo"]["latencyMs"] == 250.0
    assert policy["metadata"]["labels"]["team"] == "a"
    assert policy["metadata"]["labels"][GENERATION_LABEL] == "2"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == workflow["metadata"]["uid"]


def test_a_field_the_plan_no_longer_sets_is_removed(
    k8s_api: Any, namespace: str, workflow: dict[str, Any]
) -> None:
    name = workflow["metadata"]["name"]
    _apply_policy(k8s_api, workflow, 1, _plan(300.0, metrics=METRICS))
    assert _policy(k8s_api, namespace, name)["spec"]["metrics"] == METRICS

    _apply_policy(k8s_api, workflow, 2, _plan(300.0))

    assert "metrics" not in _policy(k8s_api, namespace, name)["spec"]


def test_a_policy_first_written_by_replace_is_adopted(
    k8s_api: Any, namespace: str, workflow: dict[str, Any]
) -> None:
    name = workflow["metadata"]["name"]
    custom = client.CustomObjectsApi(k8s_api)
    where = (GROUP, VERSION, namespace, POLICY_PLURAL)
    # What operators before server-side apply did: create, then replace, under the client's
    # default manager, and the policy controller's status writes.
    old = build_pareto_policy(workflow, 1, _plan(300.0, metrics=METRICS))
    old["spec"]["paused"] = False
    created = kubeapi.call(custom.create_namespaced_custom_object, *where, old)
    created["spec"]["slo"]["latencyMs"] = 280.0
    kubeapi.call(custom.replace_namespaced_custom_object, *where, name, created)
    kubeapi.call(
        custom.patch_namespaced_custom_object_status,
        *where,
        name,
        {"status": {"switches": 3}},
        _content_type="application/merge-patch+json",
    )
    before = _policy(k8s_api, namespace, name)
    assert set(_managers(before)) == {(workflow_plan.LEGACY_MANAGER, "Update")}
    _as_person(k8s_api, namespace, name, {"spec": {"paused": True}})

    applied = _apply_policy(k8s_api, workflow, 2, _plan(250.0))

    policy = _policy(k8s_api, namespace, name)
    assert "metrics" not in policy["spec"]  # owned only through the old manager, now removed
    assert applied.adopt  # by the takeover
    assert policy["spec"]["slo"]["latencyMs"] == 250.0
    assert policy["spec"]["paused"] is True  # the person's, set after the replace
    assert policy["status"]["switches"] == 3  # status is not the apply's
    managers = _managers(policy)
    assert ("compass-operator", "Apply") in managers
    assert "f:spec" not in managers.get((workflow_plan.LEGACY_MANAGER, "Update"), {})
    # Once adopted, nothing is taken over again.
    assert not _apply_policy(k8s_api, workflow, 3, _plan(250.0)).adopt


def test_a_policy_another_workflow_controls_is_left_alone(
    k8s_api: Any, namespace: str, workflow: dict[str, Any]
) -> None:
    name = workflow["metadata"]["name"]
    # Another workflow's policy of the same name (its owner must exist, or the garbage
    # collector deletes the policy).
    stranger = _create_workflow(k8s_api, namespace, f"{name}-other")
    body = build_pareto_policy(stranger, 1, _plan(300.0))
    body["metadata"]["name"] = name
    kubeapi.call(
        client.CustomObjectsApi(k8s_api).create_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        POLICY_PLURAL,
        body,
    )
    applied = _apply_policy(k8s_api, workflow, 2, _plan(250.0))
    assert (applied.action, applied.reason) == (
        workflow_plan.PolicyAction.BLOCKED,
        "PolicyConflict",
    )
    assert _policy(k8s_api, namespace, name)["spec"]["slo"]["latencyMs"] == 300.0


def test_the_documented_review_command_applies_the_plan_and_auto_apply_takes_it_over(
    k8s_cluster: Any, k8s_api: Any, namespace: str, workflow: dict[str, Any]
) -> None:
    """status.plannedPolicy through `kubectl get -o jsonpath | kubectl apply -f -`, as the
    PolicyPlanned Event says; once autoApply turns true the workflow takes that policy over."""
    name = workflow["metadata"]["name"]
    manifest = planned_policy(name, namespace, 1, _plan(300.0))
    kubeapi.patch_status(
        client.CustomObjectsApi(k8s_api).patch_namespaced_custom_object_status,
        GROUP,
        VERSION,
        namespace,
        WORKFLOW_PLURAL,
        name,
        body={"status": {"phase": "Planned", "plannedPolicy": manifest}},
    )
    get, apply = (
        shlex.split(part) for part in workflow_plan.review_command(name, namespace).split("|")
    )
    assert (get[0], apply) == ("kubectl", ["kubectl", "apply", "-f", "-"])
    printed = k8s_cluster.kubectl(*get[1:]).stdout
    k8s_cluster.kubectl(*apply[1:], input=printed)
    policy = _policy(k8s_api, namespace, name)
    assert policy["spec"]["front"] == manifest["spec"]["front"]
    assert "ownerReferences" not in policy["metadata"]

    applied = _apply_policy(k8s_api, workflow, 2, _plan(250.0))

    assert applied.action is workflow_plan.PolicyAction.APPLY
    policy = _policy(k8s_api, namespace, name)
    assert policy["metadata"]["ownerReferences"][0]["uid"] == workflow["metadata"]["uid"]
    assert policy["spec"]["slo"]["latencyMs"] == 250.0
