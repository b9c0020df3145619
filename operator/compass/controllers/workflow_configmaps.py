"""The I/O of a workflow's state ConfigMaps; the decisions are workflow_state's."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from kubernetes import client

from compass.api.compoundworkflow import CompoundWorkflowSpec, CompoundWorkflowStatus
from compass.controllers import kubeapi
from compass.controllers.builders import (
    GENERATION_LABEL,
    WORKFLOW_LABEL,
    build_state_config_maps,
    controller_uid,
)
from compass.controllers.workflow_state import (
    StateNameTakenError,
    StoredState,
    StoredStates,
    state_recogniser,
    state_to_read,
    stored_states,
)


def owned(items: list[dict[str, Any]], uid: str) -> list[dict[str, Any]]:
    return [item for item in items if controller_uid(item) == uid]


def generation_of(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("labels", {}).get(GENERATION_LABEL, "0"))
    except ValueError:
        return 0


# The uids of the state ConfigMaps this process created for a workflow (kopf's memo is one
# per resource): a start retried after a lost status write finds its own state by them.
_CREATED_KEY = "compass_created_states"


def created_states(memo: MutableMapping[str, Any]) -> set[str]:
    created: set[str] = memo.setdefault(_CREATED_KEY, set())
    return created


def read_states(
    api: client.ApiClient,
    workflow: Mapping[str, Any],
    status: CompoundWorkflowStatus,
    memo: MutableMapping[str, Any],
    limit: int | None = None,
) -> StoredStates:
    """The workflow's states the operator created, by generation; one ledger read, to ``limit``."""
    metadata = workflow["metadata"]
    name, namespace, uid = metadata["name"], metadata["namespace"], metadata["uid"]
    generation = int(metadata.get("generation", 1))
    core = client.CoreV1Api(api)
    # Metadata only: a tenant's ConfigMaps under these labels are never read whole.
    items = kubeapi.list_metadata(
        core.list_namespaced_config_map, namespace, label_selector=f"{WORKFLOW_LABEL}={name}"
    )
    live = [item for item in owned(items, uid) if not item["metadata"].get("deletionTimestamp")]
    recorded = status.ledger_config_map
    mine = state_recogniser(recorded, status.ledger_config_map_uid, created_states(memo))
    read = state_to_read(
        [i["metadata"]["name"] for i in live if mine(i)], name, generation, recorded
    )

    def fetch(config_map: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = kubeapi.read(
            core.read_namespaced_config_map, config_map, namespace
        )
        return found

    return stored_states(live, name, generation_of, read, limit, fetch, mine)


def delete_states(
    api: client.ApiClient,
    namespace: str,
    keep: int,
    states: Mapping[int, StoredState],
) -> None:
    core = client.CoreV1Api(api)
    for generation, state in states.items():
        if generation != keep:
            for config_map in state.names:
                kubeapi.delete(core.delete_namespaced_config_map, config_map, namespace)


def create_state(
    api: client.ApiClient,
    workflow: Mapping[str, Any],
    spec: CompoundWorkflowSpec,
    memo: MutableMapping[str, Any],
    seed: Mapping[str, str] | None = None,
) -> str:
    """The state ConfigMap after its chunks (so a Job sees the ledger whole); its uid. A name taken
    by one this process did not create: StateNameTakenError."""
    core = client.CoreV1Api(api)
    metadata = workflow["metadata"]
    created = created_states(memo)

    def whose(existing: Mapping[str, Any]) -> str | None:
        return None if existing["metadata"].get("uid") in created else "was not made by us"

    state, *chunks = build_state_config_maps(workflow, spec, seed)
    made: Mapping[str, Any] = {}
    for body in [*chunks, state]:
        try:
            made = kubeapi.create_or_take(
                core.create_namespaced_config_map,
                core.read_namespaced_config_map,
                metadata["namespace"],
                body,
                whose,
            )
        except kubeapi.OwnedByAnotherError:
            raise StateNameTakenError(body["metadata"]["name"]) from None
        created.add(made["metadata"]["uid"])
    uid: str = made["metadata"]["uid"]
    return uid
