"""`compass operator release-finalizers` against the real API server, with exactly the rights the
chart's uninstall hook grants (compass_dev.rbac.RELEASE_RULES).

A CompoundWorkflow and a ParetoPolicy left with kopf's finalizer by an operator that is gone
(the example manifests, the finalizer set as kopf sets it), deleted: they wait. The release,
run as a ServiceAccount holding only the hook's rules, takes kopf's finalizer off and nothing
else: the workflow goes, the policy keeps another's finalizer until that one is gone too.
The whole uninstall, through Helm and the hook's Job, is the e2e tier's
tests/e2e/test_readme_install_uninstall.py.
"""

from __future__ import annotations

from typing import Any

import yaml
from cluster import Cluster, wait_for
from e2e_shared import REPO
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.controllers import kubeapi
from compass.controllers.finalizers import (
    KOPF_FINALIZER,
    Released,
    release_finalizers,
    wait_for_pods_gone,
)
from compass_dev.rbac import RELEASE_POD_RULES, RELEASE_RULES, Rule

OTHERS = "example.com/keep"  # someone else's finalizer, which must stay


def _rules(rules: tuple[Rule, ...]) -> list[dict[str, Any]]:
    return [
        {"apiGroups": [r.api_group], "resources": list(r.resources), "verbs": list(r.verbs)}
        for r in rules
    ]


def _as_hook(k8s_cluster: Cluster, k8s_api: Any, namespace: str) -> Any:
    """An API client acting as a ServiceAccount bound to the hook's rules in namespace."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    name = "release-finalizers"
    core.create_namespaced_service_account(
        namespace, {"metadata": {"name": name}}, _preload_content=False
    )
    role = {"metadata": {"name": name}, "rules": _rules(RELEASE_RULES + RELEASE_POD_RULES)}
    rbac.create_namespaced_role(namespace, role, _preload_content=False)
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    rbac.create_namespaced_role_binding(namespace, binding, _preload_content=False)
    return k8s_cluster.api_client(impersonate=f"system:serviceaccount:{namespace}:{name}")


def test_the_release_takes_kopfs_finalizer_off_and_nothing_else(
    k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str, crds: None
) -> None:
    namespace = k8s_namespace
    custom = client.CustomObjectsApi(k8s_api)
    held = {
        WORKFLOW_PLURAL: ("rag-sim-workflow.yaml", [KOPF_FINALIZER]),
        POLICY_PLURAL: ("pareto-policy-gitops.yaml", [OTHERS, KOPF_FINALIZER]),
    }
    names = {}
    for plural, (example, finalizers) in held.items():
        body = yaml.safe_load((REPO / "examples" / example).read_text(encoding="utf-8"))
        body["metadata"]["finalizers"] = finalizers
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
        names[plural] = body["metadata"]["name"]
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, names[plural])

    def read(plural: str) -> dict[str, Any] | None:
        where = (GROUP, VERSION, namespace, plural, names[plural])
        found: dict[str, Any] | None = kubeapi.read(custom.get_namespaced_custom_object, *where)
        return found

    # Deleted, and waiting: no operator will take its finalizer off.
    for plural in held:
        found = read(plural)
        assert found is not None
        assert found["metadata"].get("deletionTimestamp")

    as_hook = _as_hook(k8s_cluster, k8s_api, namespace)
    # No pod of the operator's here: the wait returns at once.
    wait_for_pods_gone(as_hook, namespace, "app.kubernetes.io/name=compass-operator", 5)

    def released() -> list[Released] | None:
        try:
            return release_finalizers(as_hook, [namespace])
        except ApiException as error:
            if error.status == 403:  # the RoleBinding not yet in the authorizer's cache
                return None
            raise

    done = wait_for(released, 30, "the hook's rules to take effect")
    assert sorted((r.plural, r.name) for r in done) == sorted(names.items())
    wait_for(lambda: read(WORKFLOW_PLURAL) is None, 10, "the workflow to go")
    policy = read(POLICY_PLURAL)
    assert policy is not None
    assert policy["metadata"]["finalizers"] == [OTHERS]  # another's stays, as it was
    # Run again: nothing left to release.
    assert release_finalizers(as_hook, [namespace]) == []
    where = (GROUP, VERSION, namespace, POLICY_PLURAL, names[POLICY_PLURAL])
    ops = [{"op": "remove", "path": "/metadata/finalizers"}]
    assert kubeapi.json_patch(custom.patch_namespaced_custom_object, *where, ops=ops)
    wait_for(lambda: read(POLICY_PLURAL) is None, 10, "the policy to go")
