"""The Jobs' access: the workflow's ServiceAccount, a Role and RoleBinding per state."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from kubernetes import client

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.controllers import kubeapi
from compass.controllers.builders import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    build_job_role,
    build_job_role_binding,
    build_job_service_account,
    job_service_account_name,
    search_name,
)
from compass.controllers.settings import OperatorSettings

# The UID of the state whose Role and RoleBinding this process last made or found, per workflow.
ACCESS_KEY = "compass_job_access"

# How soon a start blocked by someone else's ServiceAccount or Role is tried again.
FOREIGN_RBAC_RETRY_S = 15.0


class ForeignJobAccessError(Exception):
    """The Jobs' ServiceAccount, or a generation's Role or RoleBinding, exists and is another's."""


def job_account(settings: OperatorSettings, workflow: Mapping[str, Any]) -> str:
    """The name of the workflow's own Jobs' ServiceAccount."""
    return job_service_account_name(settings.job_service_account, workflow["metadata"]["name"])


def ensure_service_account(
    api: client.ApiClient, workflow: Mapping[str, Any], account: str
) -> None:
    """The workflow's Jobs' ServiceAccount, owned by it, created where missing (never changed);
    one the operator did not make is refused (its holders would be granted the workflow's state)."""
    core = client.CoreV1Api(api)
    uid: str = workflow["metadata"]["uid"]

    def whose(existing: Mapping[str, Any]) -> str | None:
        made_elsewhere = not_made_here(existing)
        if made_elsewhere is not None:
            raise ForeignJobAccessError(f"ServiceAccount {account} {made_elsewhere}")
        return kubeapi.controlled_by_another(existing, uid)

    kubeapi.create_or_take(
        core.create_namespaced_service_account,
        core.read_namespaced_service_account,
        workflow["metadata"]["namespace"],
        build_job_service_account(workflow, account),
        whose,
    )


def ensure_job_access(
    api: client.ApiClient, workflow: Mapping[str, Any], spec: CompoundWorkflowSpec, account: str
) -> str | None:
    """The current generation's Role and RoleBinding, owned by its state; its UID, or None."""
    metadata = workflow["metadata"]
    name = search_name(metadata["name"], int(metadata.get("generation", 1)))
    state = kubeapi.read(
        client.CoreV1Api(api).read_namespaced_config_map, name, metadata["namespace"]
    )
    if state is None:
        return None
    rbac = client.RbacAuthorizationV1Api(api)
    uid: str = state["metadata"]["uid"]

    def whose(existing: Mapping[str, Any]) -> str | None:
        made_elsewhere = not_made_here(existing)
        if made_elsewhere is not None:
            raise ForeignJobAccessError(made_elsewhere)
        # Ours, and another state's: an earlier one of this name, not yet collected.
        return kubeapi.controlled_by_another(existing, uid)

    creations: tuple[tuple[Callable[..., Any], Callable[..., Any], dict[str, Any]], ...] = (
        (rbac.create_namespaced_role, rbac.read_namespaced_role, build_job_role(state, spec)),
        (
            rbac.create_namespaced_role_binding,
            rbac.read_namespaced_role_binding,
            build_job_role_binding(state, account),
        ),
    )
    namespace = state["metadata"]["namespace"]
    # Each is made even while the other waits for the collector: a new RoleBinding keeps the
    # Jobs' access through the earlier state's Role (the same name and rules) until it goes.
    collecting: kubeapi.OwnedByAnotherError | None = None
    for create, read, body in creations:
        try:
            kubeapi.create_or_take(create, read, namespace, body, whose)
        except ForeignJobAccessError as error:
            raise ForeignJobAccessError(
                f"{body['kind']} {body['metadata']['name']} {error}"
            ) from None
        except kubeapi.OwnedByAnotherError as error:
            collecting = collecting or error
    if collecting is not None:
        raise collecting
    return uid


def not_made_here(existing: Mapping[str, Any]) -> str | None:
    """Why an existing Job account, Role or RoleBinding is not the operator's (its label); None."""
    labels = (existing.get("metadata") or {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) == MANAGED_BY:
        return None
    return (
        f"exists and was not made by compass-operator (label {MANAGED_BY_LABEL}={MANAGED_BY} "
        "missing)"
    )


def keep_job_access(
    api: client.ApiClient,
    workflow: Mapping[str, Any],
    spec: CompoundWorkflowSpec,
    settings: OperatorSettings,
    memo: MutableMapping[str, Any],
    state: Mapping[str, Any],
) -> None:
    """A running Job's Role and RoleBinding made again for a replaced state (owned by the state,
    they go with it), checked once per state this process sees."""
    if memo.get(ACCESS_KEY) != state["metadata"]["uid"]:
        memo[ACCESS_KEY] = ensure_job_access(api, workflow, spec, job_account(settings, workflow))
