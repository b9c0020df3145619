"""Pure builders of the Kubernetes objects the operator creates: no I/O, plain dicts in and out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compass.api.compoundworkflow import (
    DATASET_DIR,
    CompoundWorkflowSpec,
    Dataset,
    EvaluatorType,
    Profiling,
    Search,
)
from compass.api.jobpod import JobPod
from compass.api.meta import GROUP, VERSION
from compass.api.routing import RoutingTarget
from compass.controllers.ledgerchunks import (
    CHUNK_OF_LABEL,
    chunk_name,
    encode,
    pieces,
    place,
    state_names,
)

# Where every module has taken it from: the state's keys are named here.
from compass.controllers.ledgerchunks import LEDGER_KEY as LEDGER_KEY
from compass.conversion import planned_manifest

MANAGED_BY = "compass-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# The field manager of what the operator server-side applies (the generated ParetoPolicy).
FIELD_MANAGER = MANAGED_BY
WORKFLOW_LABEL = f"{GROUP}/workflow"
GENERATION_LABEL = f"{GROUP}/generation"
SPEC_KEY = "spec.json"
RESULT_KEY = "result.json"
PROFILES_KEY = "profiles.json"
PROGRESS_KEY = "progress.json"
# The capacity curves' progress as an older profiling Job wrote it (read while one runs).
CURVE_PROGRESS_KEY = "curve-progress.json"
# The profiling Job's progress for the status, and its measurements so far, which a retried pod
# (or a generation that only raised maxSeconds) does not make again; gone with the profiles.
PROFILE_PROGRESS_KEY = "profile-progress.json"
PROFILE_PARTIAL_KEY = "profile-partial.json"
# In the partial profiling: when its first pod started (seconds since the epoch), what its
# maxSeconds counts from.
PARTIAL_STARTED_FIELD = "started_unix"
# Which earlier generation the ledger, the result and the profiles were carried over from.
SEED_KEY = "seed.json"
# A search pod with no resources given: enough for a space at the enumeration limit (~1Gi).
DEFAULT_SEARCH_RESOURCES = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "2Gi"},
}
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


def policy_name(workflow: str) -> str:
    """Name of the ParetoPolicy generated for a workflow (one per workflow, updated in place)."""
    return workflow


def labels(workflow: str, role: str, generation: int) -> dict[str, str]:
    """The labels of everything built for one workflow generation."""
    return {
        "app.kubernetes.io/name": "compass",
        MANAGED_BY_LABEL: MANAGED_BY,
        "app.kubernetes.io/component": role,
        WORKFLOW_LABEL: workflow,
        GENERATION_LABEL: str(generation),
    }


def owner_reference(owner: Mapping[str, Any], blocking: bool = True) -> dict[str, Any]:
    """A controller owner reference: deleting the owner garbage-collects the object (``blocking``:
    a foreground delete of the owner waits for it)."""
    metadata = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", f"{GROUP}/{VERSION}"),
        "kind": owner["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": blocking,
    }


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner, if it has one."""
    for reference in obj.get("metadata", {}).get("ownerReferences") or []:
        if reference.get("controller"):
            return str(reference["uid"])
    return None


def build_state_config_maps(
    workflow: Mapping[str, Any],
    spec: CompoundWorkflowSpec,
    seed: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The state ConfigMap (the frozen spec, ``seed``'s keys), then its seeded ledger's chunks."""
    name = workflow["metadata"]["name"]
    generation = int(workflow["metadata"].get("generation", 1))
    data = {k: v for k, v in (seed or {}).items() if k != LEDGER_KEY}
    data[SPEC_KEY] = spec.model_dump_json(by_alias=True, exclude_none=True)
    state: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": search_name(name, generation),
            "namespace": workflow["metadata"]["namespace"],
            "labels": labels(name, "search", generation),
            "ownerReferences": [owner_reference(workflow)],
        },
        "data": data,
    }
    chunks = place([encode(piece) for piece in pieces((seed or {}).get(LEDGER_KEY, ""))])
    return [state] + [
        build_ledger_chunk(state, index, binary) for index, binary in enumerate(chunks, 1)
    ]


def build_ledger_chunk(
    state: Mapping[str, Any], index: int, binary: Mapping[str, str]
) -> dict[str, Any]:
    """The state's index-th chunk ConfigMap: the state's labels and owner, and CHUNK_OF_LABEL."""
    metadata = state["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": chunk_name(metadata["name"], index),
            "namespace": metadata["namespace"],
            "labels": {**(metadata.get("labels") or {}), CHUNK_OF_LABEL: metadata["name"]},
            "ownerReferences": [dict(r) for r in metadata.get("ownerReferences") or []],
        },
        "binaryData": dict(binary),
    }


def _job(
    workflow: Mapping[str, Any],
    role: str,
    section: Search | Profiling,
    backoff_limit: int,
    image: str,
    service_account: str,
    pull_secrets: Sequence[str],
    resources: Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    volumes: Sequence[Mapping[str, Any]] = (),
    mounts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The generation's Job running `compass job ROLE` on its state, as its spec section asks."""
    metadata = workflow["metadata"]
    generation = int(metadata.get("generation", 1))
    job_labels = labels(metadata["name"], role, generation)
    state = search_name(metadata["name"], generation)
    container: dict[str, Any] = {
        "name": role,
        "image": section.image or image,
        "command": ["compass", "job", role, "--state", state],
        "env": [
            {"name": "COMPASS_NAMESPACE", "value": metadata["namespace"]},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *({"name": k, "value": v} for k, v in sorted((env or {}).items())),
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        # The image stays read-only; the search's working copy of its ledger lives in /tmp.
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *map(dict, mounts)],
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
            "name": _name(metadata["name"], role, generation),
            "namespace": metadata["namespace"],
            "labels": job_labels,
            "ownerReferences": [owner_reference(workflow)],
        },
        "spec": {
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": section.active_deadline_seconds,
            "template": {
                "metadata": {"labels": job_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": service_account,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}, *map(dict, volumes)],
                    **job_pod_fields(section, pull_secrets),
                },
            },
        },
    }


def job_pod_fields(section: JobPod, pull_secrets: Sequence[str] = ()) -> dict[str, Any]:
    """A Job section's placement and pull secrets (the operator's, then its own) as pod fields."""
    pod: dict[str, Any] = {}
    if section.node_selector:
        pod["nodeSelector"] = dict(section.node_selector)
    if section.tolerations:
        pod["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in section.tolerations
        ]
    if section.affinity:
        pod["affinity"] = dict(section.affinity)
    if section.priority_class_name:
        pod["priorityClassName"] = section.priority_class_name
    if section.runtime_class_name:
        pod["runtimeClassName"] = section.runtime_class_name
    names = dict.fromkeys([*pull_secrets, *(s.name for s in section.image_pull_secrets)])
    if names:
        pod["imagePullSecrets"] = [{"name": name} for name in names]
    return pod


def evaluated_spec(spec: CompoundWorkflowSpec) -> CompoundWorkflowSpec:
    """The spec the Jobs send to Triton: spec.triton.evaluationService, if given, as its Service."""
    staging = spec.triton.evaluation_service
    if not staging:
        return spec
    triton = spec.triton.model_copy(update={"service": staging, "evaluation_service": None})
    return spec.model_copy(update={"triton": triton})


def triton_address(workflow: Mapping[str, Any], spec: CompoundWorkflowSpec) -> str:
    """host:port of the workflow's Triton gRPC endpoint inside the cluster."""
    namespace = spec.triton.namespace or workflow["metadata"]["namespace"]
    # NAME.NAMESPACE.svc, not NAME.NAMESPACE: only the former is sure to be a Service (see
    # compass.controllers.targets), so the generated policy's endpoint passes its checks.
    host = (
        spec.triton.service
        if "." in spec.triton.service
        else f"{spec.triton.service}.{namespace}.svc"
    )
    return f"{host}:{spec.triton.grpc_port}"


def routing_target(workflow: Mapping[str, Any], spec: CompoundWorkflowSpec) -> RoutingTarget:
    """What the policy switches: the pods of a Service in its namespace, else one address."""
    namespace = workflow["metadata"]["namespace"]
    triton = spec.triton
    if "." not in triton.service and triton.namespace in (None, namespace):
        return RoutingTarget(
            service=triton.service,
            grpc_port=triton.grpc_port,
            metrics_port=triton.metrics_port,
            router_model=triton.router_model,
            tls=triton.tls,
        )
    return RoutingTarget(
        grpc_endpoint=triton_address(workflow, spec),
        router_model=triton.router_model,
        tls=triton.tls,
    )


def metrics_url(workflow: Mapping[str, Any], spec: CompoundWorkflowSpec) -> str:
    """Triton's Prometheus metrics URL inside the cluster (the host of its gRPC endpoint)."""
    host = triton_address(workflow, spec).rsplit(":", 1)[0]
    return f"http://{host}:{spec.triton.metrics_port}/metrics"


def dataset_path(dataset: Dataset) -> str | None:
    """Where the search pod finds the dataset (build_search_job's mounts); None without a source."""
    if dataset.config_map is not None:
        return f"{DATASET_DIR}/{dataset.config_map.key}"
    if dataset.volume is not None:
        return f"{DATASET_DIR}/{dataset.volume.path.lstrip('/')}"
    return dataset.image_path or None


def build_search_job(
    workflow: Mapping[str, Any],
    spec: CompoundWorkflowSpec,
    image: str,
    service_account: str,
    env: Mapping[str, str] | None = None,
    pull_secrets: Sequence[str] = (),
) -> dict[str, Any]:
    """The COMPASS-V Job of the current generation, the dataset mounted at $COMPASS_DATASET."""
    dataset = spec.evaluation.dataset
    volumes: list[dict[str, Any]] = []
    if dataset.config_map is not None:
        volumes.append({"name": "dataset", "configMap": {"name": dataset.config_map.name}})
    elif dataset.volume is not None:
        claim = {"claimName": dataset.volume.claim_name, "readOnly": True}
        volumes.append({"name": "dataset", "persistentVolumeClaim": claim})
    mounts = [{"name": "dataset", "mountPath": DATASET_DIR, "readOnly": True}] if volumes else []
    path = dataset_path(dataset)
    return _job(
        workflow,
        "search",
        spec.search,
        spec.search.backoff_limit,
        image,
        service_account,
        pull_secrets,
        spec.search.resources.as_container() or DEFAULT_SEARCH_RESOURCES,
        {**(env or {}), **({"COMPASS_DATASET": path} if path else {})},
        volumes,
        mounts,
    )


def build_profile_job(
    workflow: Mapping[str, Any],
    spec: CompoundWorkflowSpec,
    image: str,
    service_account: str,
    env: Mapping[str, str] | None = None,
    pull_secrets: Sequence[str] = (),
) -> dict[str, Any]:
    """The Job that profiles the feasible configurations: a client of the Triton pods."""
    return _job(
        workflow,
        "profile",
        spec.profiling,
        spec.search.backoff_limit,
        image,
        service_account,
        pull_secrets,
        spec.profiling.resources.as_container(),
        env,
    )


def job_env(triton_override: str | None) -> dict[str, str]:
    """Extra environment of the Jobs: where Triton is, when the operator is told to override it."""
    return {"COMPASS_TRITON_ADDRESS": triton_override} if triton_override else {}


def job_service_account_name(prefix: str, workflow: str) -> str:
    """``<prefix>-<workflow>``: each workflow's own, so only its Jobs read the Secrets it names."""
    return f"{prefix}-{workflow}"


def build_job_service_account(workflow: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The ServiceAccount a workflow's Jobs run as, owned (so collected) by the workflow."""
    metadata = workflow["metadata"]
    # Nothing waits on the account, and blocking would ask for compoundworkflows/finalizers
    # where the OwnerReferencesPermissionEnforcement admission plugin runs.
    owner = owner_reference(workflow, blocking=False)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": metadata["namespace"],
            "labels": {
                "app.kubernetes.io/name": "compass",
                MANAGED_BY_LABEL: MANAGED_BY,
                WORKFLOW_LABEL: metadata["name"],
            },
            "ownerReferences": [owner],
        },
    }


def job_rules(
    state: str, replayed: str | None = None, tls_secret: str | None = None
) -> list[dict[str, Any]]:
    """What one generation's Job pods may do: read or change only their own objects, by name."""
    rules: list[dict[str, Any]] = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "patch"],
            "resourceNames": state_names(state),
        },
        # RBAC cannot narrow a create by name: the chunks a long ledger rolls over into.
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        # The profiling Job spreads its measurements over the Service's ready pods (list: RBAC
        # cannot narrow a list by the Service's label).
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
        # Each Pod those slices name, read by name: a slice's author can list any address, and
        # only a Pod of this namespace at that IP is measured (as the operator switches it).
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]
    if replayed is not None:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get"],
                "resourceNames": state_names(replayed),
            }
        )
    if tls_secret is not None:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get"],
                "resourceNames": [tls_secret],
            }
        )
    return rules


def _job_access(state: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A Role's or RoleBinding's head: named, labelled and owned as its state (so collected)."""
    metadata = state["metadata"]
    # Not blocking: nothing waits on the Role, and it would ask for configmaps/finalizers where
    # the OwnerReferencesPermissionEnforcement admission plugin runs.
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": dict(metadata.get("labels") or {}),
            "ownerReferences": [owner_reference(owner, blocking=False)],
        },
    }


def build_job_role(state: Mapping[str, Any], spec: CompoundWorkflowSpec) -> dict[str, Any]:
    """The Role of one generation's Job pods (job_rules), from its stored state and its spec."""
    evaluator = spec.evaluation.evaluator
    replayed = evaluator.replay_config_map if evaluator.type is EvaluatorType.REPLAY else None
    tls = spec.triton.tls
    rules = job_rules(
        state["metadata"]["name"], replayed, None if tls is None else tls.secret_ref.name
    )
    return {**_job_access(state, "Role"), "rules": rules}


def build_job_role_binding(state: Mapping[str, Any], account: str) -> dict[str, Any]:
    """Binds one generation's Role to its workflow's Jobs' ServiceAccount."""
    binding = _job_access(state, "RoleBinding")
    metadata = binding["metadata"]
    return {
        **binding,
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": metadata["name"],
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": account, "namespace": metadata["namespace"]}
        ],
    }


def planned_policy(
    workflow: str, namespace: str, generation: int, policy_spec: Mapping[str, Any]
) -> dict[str, Any]:
    """The planned ParetoPolicy: only the fields the operator owns (never spec.paused), labelled."""
    return planned_manifest(
        policy_name(workflow), namespace, policy_spec, labels(workflow, "policy", generation)
    )


def build_pareto_policy(
    workflow: Mapping[str, Any], generation: int, policy_spec: Mapping[str, Any]
) -> dict[str, Any]:
    """The planned ParetoPolicy as applied: owned by the workflow, so deleted with it."""
    metadata = workflow["metadata"]
    body = planned_policy(metadata["name"], metadata["namespace"], generation, policy_spec)
    body["metadata"]["ownerReferences"] = [owner_reference(workflow)]
    return body
