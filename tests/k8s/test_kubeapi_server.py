"""compass.controllers.kubeapi against a real API server: what each helper does with the
answers (201, 200, 404, 409) that the controllers rely on, and the StateStore the Jobs use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster, crd_established, wait_for
from kubernetes import client

from compass.commands.job_state import StateStore
from compass.controllers import kubeapi

GROUP, VERSION, PLURAL = "kubeapi.test.compass.io", "v1", "gadgets"
GADGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "gadget", "kind": "Gadget"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def gadgets(k8s_api: Any) -> Iterator[client.CustomObjectsApi]:
    """A CRD with a status subresource, of this module's own (deleted at the end)."""
    extensions = client.ApiextensionsV1Api(k8s_api)
    name = GADGET_CRD["metadata"]["name"]
    kubeapi.create(extensions.create_custom_resource_definition, GADGET_CRD)

    wait_for(lambda: crd_established(k8s_api, name), 30, f"CRD {name}")
    yield client.CustomObjectsApi(k8s_api)
    kubeapi.delete(extensions.delete_custom_resource_definition, name)


def _config_map(name: str, owner: dict[str, Any] | None = None, **labels: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": name}}


def test_load_client_follows_kubeconfig(
    k8s_cluster: Cluster, k8s_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    core = client.CoreV1Api(kubeapi.load_client())
    found = kubeapi.read(core.read_namespace, k8s_namespace)
    assert found["metadata"]["name"] == k8s_namespace


def test_read_create_list_delete(k8s_api: Any, k8s_namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    read = core.read_namespaced_config_map
    assert kubeapi.read(read, "a", k8s_namespace) is None
    created = kubeapi.create(core.create_namespaced_config_map, k8s_namespace, _config_map("a"))
    assert created["metadata"]["name"] == "a"
    assert created["metadata"]["uid"]
    again = _config_map("a")
    again["data"] = {"k": "changed"}
    assert kubeapi.create(core.create_namespaced_config_map, k8s_namespace, again) is None
    assert kubeapi.read(read, "a", k8s_namespace)["data"] == {"k": "a"}  # the first one stays
    kubeapi.create(core.create_namespaced_config_map, k8s_namespace, _config_map("b", app="x"))
    listed = kubeapi.list_items(
        core.list_namespaced_config_map, k8s_namespace, label_selector="app=x"
    )
    assert [item["metadata"]["name"] for item in listed] == ["b"]
    assert kubeapi.delete(core.delete_namespaced_config_map, "a", k8s_namespace) is True
    assert kubeapi.delete(core.delete_namespaced_config_map, "a", k8s_namespace) is False
    assert kubeapi.read(read, "a", k8s_namespace) is None


def test_create_or_adopt_takes_its_own_and_refuses_anothers(
    k8s_api: Any, k8s_namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)

    def create_or_adopt(body: dict[str, Any], uid: str) -> Any:
        return kubeapi.create_or_adopt(
            core.create_namespaced_config_map,
            core.read_namespaced_config_map,
            k8s_namespace,
            body,
            uid,
        )

    # Real owners, so that the garbage collector leaves their dependents alone.
    mine = kubeapi.call(core.create_namespaced_config_map, k8s_namespace, _config_map("mine"))
    other = kubeapi.call(core.create_namespaced_config_map, k8s_namespace, _config_map("other"))
    uid = mine["metadata"]["uid"]
    created = create_or_adopt(_config_map("state", mine), uid)
    adopted = create_or_adopt(_config_map("state", mine), uid)
    assert adopted["metadata"]["uid"] == created["metadata"]["uid"]
    kubeapi.call(core.create_namespaced_config_map, k8s_namespace, _config_map("loose"))
    assert create_or_adopt(_config_map("loose", mine), uid)["metadata"]["name"] == "loose"
    create_or_adopt(_config_map("theirs", other), other["metadata"]["uid"])
    with pytest.raises(kubeapi.OwnedByAnotherError, match="ConfigMap theirs"):
        create_or_adopt(_config_map("theirs", mine), uid)


def test_create_or_adopt_creates_again_what_was_collected_between_its_create_and_its_read(
    k8s_api: Any, k8s_namespace: str
) -> None:
    """An earlier owner's object of the wanted name, deleted by the collector after the create
    found it (409) and before the read (404), is made again, not reported as done."""
    core = client.CoreV1Api(k8s_api)
    earlier = kubeapi.call(core.create_namespaced_config_map, k8s_namespace, _config_map("old"))
    mine = kubeapi.call(core.create_namespaced_config_map, k8s_namespace, _config_map("new"))
    kubeapi.call(core.create_namespaced_config_map, k8s_namespace, _config_map("access", earlier))
    reads: list[str] = []

    def read_after_the_collector(name: str, namespace: str, **kwargs: Any) -> Any:
        if not reads:  # the collector's turn falls between the 409 and this read
            core.delete_namespaced_config_map(name, namespace, _preload_content=False)
        reads.append(name)
        return core.read_namespaced_config_map(name, namespace, **kwargs)

    made = kubeapi.create_or_adopt(
        core.create_namespaced_config_map,
        read_after_the_collector,
        k8s_namespace,
        _config_map("access", mine),
        mine["metadata"]["uid"],
    )
    assert reads == ["access"]
    assert made is not None
    assert made["metadata"]["ownerReferences"][0]["uid"] == mine["metadata"]["uid"]
    stored = kubeapi.read(core.read_namespaced_config_map, "access", k8s_namespace)
    assert stored["metadata"]["uid"] == made["metadata"]["uid"]


def test_status_patch_and_the_errors_a_caller_tells_apart(
    gadgets: client.CustomObjectsApi, k8s_namespace: str
) -> None:
    where = (GROUP, VERSION, k8s_namespace, PLURAL)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Gadget", "metadata": {"name": "g"}}
    gadget = kubeapi.call(gadgets.create_namespaced_custom_object, *where, body)
    version = gadget["metadata"]["resourceVersion"]
    patch = gadgets.patch_namespaced_custom_object_status

    fresh = {"metadata": {"resourceVersion": version}, "status": {"phase": "One"}}
    assert kubeapi.patch_status(patch, *where, "g", body=fresh) is True
    current = kubeapi.read(gadgets.get_namespaced_custom_object, *where, "g")
    assert current["status"] == {"phase": "One"}
    # The same resourceVersion again is stale now: the write is refused, nothing changes.
    stale = {"metadata": {"resourceVersion": version}, "status": {"phase": "Two"}}
    assert kubeapi.patch_status(patch, *where, "g", body=stale) is False
    assert kubeapi.read(gadgets.get_namespaced_custom_object, *where, "g")["status"] == {
        "phase": "One"
    }
    assert kubeapi.patch_status(patch, *where, "gone", body={"status": {}}) is False

    gadget["metadata"]["resourceVersion"] = version
    with pytest.raises(kubeapi.ConflictError):
        kubeapi.call(gadgets.replace_namespaced_custom_object, *where, "g", gadget)
    unserved = (GROUP, VERSION, k8s_namespace, "nosuchthings")
    with pytest.raises(kubeapi.NotFoundError):
        kubeapi.call(gadgets.create_namespaced_custom_object, *unserved, body)
    assert kubeapi.read(gadgets.get_namespaced_custom_object, *unserved, "g") is None

    # An answer not asked for (a status write's whole object) is read, not parsed: None, and
    # the write made all the same, the connection good for the next call.
    merge = "application/merge-patch+json"
    three = {"status": {"phase": "Three"}}
    assert kubeapi.call(patch, *where, "g", three, _content_type=merge, answer=False) is None
    assert kubeapi.read(gadgets.get_namespaced_custom_object, *where, "g")["status"] == {
        "phase": "Three"
    }


def test_apply_owns_its_fields_and_a_stale_json_patch_is_refused(
    gadgets: client.CustomObjectsApi, k8s_namespace: str
) -> None:
    """apply: created when missing (who owns what is in tests/k8s/test_gitops_apply.py, on a
    structural schema); json_patch: False when its resourceVersion test fails (changed since
    read) or the object is gone."""
    where = (GROUP, VERSION, k8s_namespace, PLURAL, "g")
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gadget",
        "metadata": {"name": "g"},
        "spec": {"size": 3},
    }
    applied = kubeapi.apply(gadgets.patch_namespaced_custom_object, *where, body=body)
    assert applied["spec"] == {"size": 3}
    version = applied["metadata"]["resourceVersion"]
    test = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
    relabel = [*test, {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    assert kubeapi.json_patch(gadgets.patch_namespaced_custom_object, *where, ops=relabel)
    assert not kubeapi.json_patch(gadgets.patch_namespaced_custom_object, *where, ops=relabel)
    # A patch that makes the object invalid is no change meanwhile: an error, not False.
    fresh = kubeapi.read(gadgets.get_namespaced_custom_object, *where)["metadata"]
    invalid = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": fresh["resourceVersion"]},
        {"op": "add", "path": "/metadata/labels/c", "value": "not a label value!"},
    ]
    with pytest.raises(kubeapi.PatchRefusedError, match="is invalid"):
        kubeapi.json_patch(gadgets.patch_namespaced_custom_object, *where, ops=invalid)
    kubeapi.delete(gadgets.delete_namespaced_custom_object, *where)
    assert not kubeapi.json_patch(gadgets.patch_namespaced_custom_object, *where, ops=relabel)


def test_state_store_reads_and_patches_its_config_map(
    k8s_api: Any, k8s_cluster: Cluster, k8s_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    core = client.CoreV1Api(k8s_api)
    kubeapi.call(core.create_namespaced_config_map, k8s_namespace, _config_map("state"))
    store = StateStore("state", k8s_namespace)
    store.write({"ledger.jsonl": "{}\n"})
    assert store.read() == {"k": "state", "ledger.jsonl": "{}\n"}
    with pytest.raises(kubeapi.NotFoundError, match="404"):
        StateStore("missing", k8s_namespace).read()
