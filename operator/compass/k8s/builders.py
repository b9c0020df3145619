"""Pure builders of the Kubernetes objects the operator creates: no I/O, plain dicts in and out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from compass.k8s.crds import GROUP, VERSION
from compass.k8s.workflow import CompoundWorkflowSpec

MANAGED_BY = "compass-operator"
WORKFLOW_LABEL = f"{GROUP}/workflow"
GENERATION_LABEL = f"{GROUP}/generation"
ROLE_LABEL = f"{GROUP}/role"
SPEC_KEY = "spec.json"
LEDGER_KEY = "ledger.jsonl"
RESULT_KEY = "result.json"
PROFILES_KEY = "profiles.json"
# Kubernetes names are at most 63 characters in labels; Job names feed pod labels.
_MAX_NAME = 52


def _name(workflow: str, role: str, generation: int) -> str:
    suffix = f"-{role}-g{generation}"
    return f"{workflow[: _MAX_NAME - len(suffix)]}{suffix}"


def search_name(workflow: str, generation: int) -> str:
    """Name of the search Job and of its state ConfigMap for one spec generation."""
    return _name(workflow, "search", generation)


def profile_name(workflow: str, generation: int) -> str:
    """Name of the profiling Job for one spec generation."""
    return _name(workflow, "profile", generation)


def labels(workflow: str, role: str, generation: int) -> dict[str, str]:
    """The labels of everything built for one workflow generation."""
    return {
        "app.kubernetes.io/name": "compass",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/component": role,
        WORKFLOW_LABEL: workflow,
        GENERATION_LABEL: str(generation),
    }


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """A controller owner reference: deleting the owner garbage-collects the object."""
    metadata = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", f"{GROUP}/{VERSION}"),
        "kind": owner["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_state_config_map(
    workflow: Mapping[str, Any], spec: CompoundWorkflowSpec
) -> dict[str, Any]:
    """The search's state: the spec it searches (frozen at this generation) and its ledger.

    The search Job appends every evaluated batch to the ledger here, so a pod that restarts,
    or an operator that restarts, resumes without evaluating any sample twice.
    """
    name = workflow["metadata"]["name"]
    generation = int(workflow["metadata"].get("generation", 1))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": search_name(name, generation),
            "namespace": workflow["metadata"]["namespace"],
            "labels": labels(name, "search", generation),
            "ownerReferences": [owner_reference(workflow)],
        },
        "data": {
            SPEC_KEY: spec.model_dump_json(by_alias=True, exclude_none=True),
            LEDGER_KEY: "",
        },
    }


def _job(
    workflow: Mapping[str, Any],
    role: str,
    name: str,
    command: list[str],
    image: str,
    service_account: str,
    backoff_limit: int,
    deadline_s: int,
    pod_extra: Mapping[str, Any] | None = None,
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    metadata = workflow["metadata"]
    generation = int(metadata.get("generation", 1))
    job_labels = labels(metadata["name"], role, generation)
    container: dict[str, Any] = {
        "name": role,
        "image": image,
        "command": command,
        "env": [
            {"name": "COMPASS_NAMESPACE", "value": metadata["namespace"]},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        # The last lines of output become the pod's termination message, which the operator
        # copies into the workflow's condition when the Job fails.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if resources:
        container["resources"] = dict(resources)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": metadata["namespace"],
            "labels": job_labels,
            "ownerReferences": [owner_reference(workflow)],
        },
        "spec": {
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": deadline_s,
            "template": {
                "metadata": {"labels": job_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": service_account,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    **(pod_extra or {}),
                },
            },
        },
    }


def triton_address(workflow: Mapping[str, Any], spec: CompoundWorkflowSpec) -> str:
    """host:port of the workflow's Triton gRPC endpoint inside the cluster."""
    namespace = spec.triton.namespace or workflow["metadata"]["namespace"]
    host = (
        spec.triton.service if "." in spec.triton.service else f"{spec.triton.service}.{namespace}"
    )
    return f"{host}:{spec.triton.grpc_port}"


def build_search_job(
    workflow: Mapping[str, Any], spec: CompoundWorkflowSpec, image: str, service_account: str
) -> dict[str, Any]:
    """The Job that runs COMPASS-V for the workflow's current generation."""
    name = workflow["metadata"]["name"]
    generation = int(workflow["metadata"].get("generation", 1))
    state = search_name(name, generation)
    return _job(
        workflow,
        "search",
        state,
        ["compass", "job", "search", "--state", state],
        spec.search.image or image,
        service_account,
        spec.search.backoff_limit,
        spec.search.active_deadline_seconds,
    )


def build_profile_job(
    workflow: Mapping[str, Any], spec: CompoundWorkflowSpec, image: str, service_account: str
) -> dict[str, Any]:
    """The Job that profiles the feasible configurations on the target node pool."""
    name = workflow["metadata"]["name"]
    generation = int(workflow["metadata"].get("generation", 1))
    pod: dict[str, Any] = {}
    if spec.profiling.node_selector:
        pod["nodeSelector"] = dict(spec.profiling.node_selector)
    if spec.profiling.tolerations:
        pod["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in spec.profiling.tolerations
        ]
    resources = spec.profiling.resources.model_dump(by_alias=True, exclude_defaults=True)
    return _job(
        workflow,
        "profile",
        profile_name(name, generation),
        ["compass", "job", "profile", "--state", search_name(name, generation)],
        spec.profiling.image or image,
        service_account,
        spec.search.backoff_limit,
        spec.profiling.active_deadline_seconds,
        pod_extra=pod,
        resources=resources,
    )


def canonical_json(value: Any) -> str:
    """Stable JSON for ConfigMap values (sorted keys, compact)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
