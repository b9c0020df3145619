"""Releasing kopf's finalizers once the operator is gone for good (the post-delete hook)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.controllers import kubeapi

# The marker kopf adds (its settings.persistence.finalizer, which the operator leaves as it is).
KOPF_FINALIZER: str = kopf.OperatorSettings().persistence.finalizer
PLURALS = (WORKFLOW_PLURAL, POLICY_PLURAL)
# Patches of one object that lost to a concurrent change before it is read again and retried.
_ATTEMPTS = 5


class OperatorStillRunningError(Exception):
    """The operator's pods did not go within the time given: releasing would race with them."""


@dataclass(frozen=True)
class Released:
    """One object whose kopf finalizer was taken off."""

    plural: str
    namespace: str
    name: str


def build_finalizer_release(obj: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch taking kopf's finalizer off ``obj`` (the list tested first); None without."""
    finalizers = list((obj.get("metadata") or {}).get("finalizers") or [])
    if KOPF_FINALIZER not in finalizers:
        return None
    index = finalizers.index(KOPF_FINALIZER)
    return [
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]


def _listed(custom: client.CustomObjectsApi, plural: str, namespace: str | None) -> list[Any]:
    """The resources of one plural, in a namespace or the cluster; none where the CRD is gone."""
    try:
        if namespace is None:
            return kubeapi.list_items(custom.list_cluster_custom_object, GROUP, VERSION, plural)
        return kubeapi.list_items(
            custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural
        )
    except kubeapi.NotFoundError:
        return []


def _release_one(custom: client.CustomObjectsApi, plural: str, obj: Mapping[str, Any]) -> bool:
    """Take kopf's finalizer off one object (read again after a lost race); whether it had one."""
    metadata = obj["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    current: Mapping[str, Any] | None = obj
    for _ in range(_ATTEMPTS):
        if current is None:
            return False
        ops = build_finalizer_release(current)
        if ops is None:
            return False
        where = (GROUP, VERSION, namespace, plural, name)
        if kubeapi.json_patch(custom.patch_namespaced_custom_object, *where, ops=ops):
            return True
        current = kubeapi.read(custom.get_namespaced_custom_object, *where)
    raise kubeapi.ConflictError(
        status=409,
        reason=f"{plural} {namespace}/{name} kept changing while its finalizer was taken off",
    )


def release_finalizers(api: client.ApiClient, namespaces: Sequence[str] | None) -> list[Released]:
    """Take kopf's finalizer off every workflow and policy of ``namespaces`` (None: all); which."""
    custom = client.CustomObjectsApi(api)
    released: list[Released] = []
    scopes: Iterable[str | None] = namespaces if namespaces else (None,)
    for namespace in scopes:
        for plural in PLURALS:
            for obj in _listed(custom, plural, namespace):
                if _release_one(custom, plural, obj):
                    metadata = obj["metadata"]
                    released.append(Released(plural, metadata["namespace"], metadata["name"]))
    return released


def wait_for_pods_gone(
    api: client.ApiClient, namespace: str, selector: str, timeout_s: float
) -> None:
    """Return once no operator pod (which would put its finalizers back) matches ``selector``."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout_s
    while True:
        pods = kubeapi.list_items(core.list_namespaced_pod, namespace, label_selector=selector)
        if not pods:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(sorted(p["metadata"]["name"] for p in pods))
            raise OperatorStillRunningError(
                f"the operator's pods ({names}) in namespace {namespace} did not go within "
                f"{timeout_s:g} s"
            )
        time.sleep(1.0)
