"""Pods on their own loopback IPs behind a Service, with real EndpointSlices.

The node helper gives each pod an address of its pod network (127.0.2.0/24) and probes its
readiness like a kubelet; the real endpointslice controller (discovery.k8s.io/v1beta1 in 1.20)
fills the Service's slices from the pods' status.podIP and Ready condition. The pods are
`python3 -m http.server` bound to their own IP (the downward API's status.podIP), serving their
working directory: the readiness probe asks for the file `ready`, which a test removes to make
a pod unready.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from cluster import Cluster, wait_for
from kubernetes import client

from compass_dev.devnode import Node
from compass_dev.podnetwork import POD_NETWORK

APP = "web"
PORT = 8080
WAIT_S = 30  # each step takes a few probe periods (1 s) and a controller sync
# The container writes its pod's name (so a test can tell who answers) and the file the readiness
# probe asks for, then serves its directory on its own IP. $(POD_IP) is Kubernetes' expansion.
SERVER = (
    f'echo "$HOSTNAME" > name; touch ready; exec python3 -m http.server --bind $(POD_IP) {PORT}'
)


def _data(response: Any) -> Any:
    """The JSON body of a call made with _preload_content=False."""
    return json.loads(response.data)


def _deployment(replicas: int) -> dict[str, Any]:
    container = {
        "name": "http",
        "image": "python:3.11-slim",
        "command": ["sh", "-c", SERVER],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
    }
    return {
        "metadata": {"name": APP},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": APP}},
            "template": {"metadata": {"labels": {"app": APP}}, "spec": {"containers": [container]}},
        },
    }


SERVICE = {
    "metadata": {"name": APP},
    "spec": {"selector": {"app": APP}, "ports": [{"port": 80, "targetPort": "http"}]},
}


def _endpoints(cluster: Cluster, namespace: str) -> dict[str, bool]:
    """The Service's endpoints over all its EndpointSlices: address -> ready."""
    path = (
        f"/apis/discovery.k8s.io/v1beta1/namespaces/{namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name%3D{APP}"
    )
    return {
        address: bool(endpoint["conditions"].get("ready"))
        for piece in cluster.request(path)["items"]
        for endpoint in piece.get("endpoints") or []
        for address in endpoint["addresses"]
    }


def _pods(core: client.CoreV1Api, namespace: str) -> dict[str, dict[str, Any]]:
    """The app's pods that are not being deleted, by name."""
    listing = _data(
        core.list_namespaced_pod(namespace, label_selector=f"app={APP}", _preload_content=False)
    )
    return {
        p["metadata"]["name"]: p
        for p in listing["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


def _get(ip: str, path: str) -> tuple[int, str]:
    """GET http://ip:PORT/path straight (no proxy): the status and the body."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{ip}:{PORT}/{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def _condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    [found] = [c for c in conditions if c["type"] == type_]
    return found


def _await(
    condition: Callable[[], Any], what: str, cluster: Cluster, core: client.CoreV1Api, ns: str
) -> Any:
    """wait_for(condition), and on a timeout the pods, slices and events that tell why."""
    try:
        return wait_for(condition, WAIT_S, what, 0.2)
    except TimeoutError as error:
        pods = {
            name: (p["status"].get("podIP"), p["status"].get("conditions"))
            for name, p in _pods(core, ns).items()
        }
        events = cluster.kubectl("get", "events", "-n", ns).stdout
        raise AssertionError(
            f"{error}\npods: {pods}\nendpoints: {_endpoints(cluster, ns)}\nevents:\n{events}"
        ) from None


@pytest.fixture
def web(
    k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str, k8s_node: Node
) -> dict[str, dict[str, Any]]:
    """A Service in front of a 2-replica Deployment whose pods are both ready: the pods."""
    core, apps = client.CoreV1Api(k8s_api), client.AppsV1Api(k8s_api)
    core.create_namespaced_service(k8s_namespace, SERVICE, _preload_content=False)
    apps.create_namespaced_deployment(k8s_namespace, _deployment(2), _preload_content=False)

    def both_ready() -> dict[str, dict[str, Any]] | None:
        pods = _pods(core, k8s_namespace)
        ips = {p["status"].get("podIP") for p in pods.values()}
        endpoints = _endpoints(k8s_cluster, k8s_namespace)
        ok = len(pods) == 2 and set(endpoints) == ips and all(endpoints.values())
        return pods if ok else None

    pods: dict[str, dict[str, Any]] = _await(
        both_ready, "2 ready endpoints", k8s_cluster, core, k8s_namespace
    )
    return pods


def test_pods_get_their_own_ips_and_ready_endpoints(
    web: dict[str, dict[str, Any]],
    k8s_cluster: Cluster,
    k8s_api: Any,
    k8s_namespace: str,
    k8s_node: Node,
) -> None:
    """Distinct pod IPs, each serving its own pod; the slices follow readiness and restarts."""
    core = client.CoreV1Api(k8s_api)
    ips = {name: pod["status"]["podIP"] for name, pod in web.items()}
    assert len(set(ips.values())) == 2, ips
    network = ipaddress.IPv4Network(POD_NETWORK)
    for name, pod in web.items():
        status = pod["status"]
        assert ipaddress.IPv4Address(ips[name]) in network, ips
        assert status["podIPs"] == [{"ip": ips[name]}]
        assert status["hostIP"] == "127.0.0.1"
        assert pod["spec"]["nodeName"] == k8s_node.name
        # The server bound $(POD_IP), from the fieldRef: it is this pod that answers there.
        assert _get(ips[name], "name") == (200, f"{name}\n")

    path = f"/apis/discovery.k8s.io/v1beta1/namespaces/{k8s_namespace}/endpointslices"
    [piece] = k8s_cluster.request(f"{path}?labelSelector=kubernetes.io/service-name%3D{APP}")[
        "items"
    ]
    assert piece["addressType"] == "IPv4"
    assert piece["ports"] == [{"name": "", "port": PORT, "protocol": "TCP"}]
    targets = {e["targetRef"]["name"]: e["addresses"] for e in piece["endpoints"]}
    assert targets == {name: [ip] for name, ip in ips.items()}
    for endpoint in piece["endpoints"]:
        assert endpoint["topology"]["kubernetes.io/hostname"] == k8s_node.name

    # Unready: the probe's file is gone. The endpoint stays, not ready; the pod says so too.
    first, second = sorted(web)
    (k8s_node.pod_dir(k8s_namespace, first) / "ready").unlink()

    def first_unready() -> bool:
        return _endpoints(k8s_cluster, k8s_namespace) == {ips[first]: False, ips[second]: True}

    _await(first_unready, f"{first}'s endpoint to be not ready", k8s_cluster, core, k8s_namespace)
    pod = _pods(core, k8s_namespace)[first]
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == conditions["ContainersReady"] == "False"
    assert pod["status"]["containerStatuses"][0]["ready"] is False
    (k8s_node.pod_dir(k8s_namespace, first) / "ready").touch()

    def both_ready() -> bool:
        return _endpoints(k8s_cluster, k8s_namespace) == {ips[first]: True, ips[second]: True}

    _await(both_ready, f"{first}'s endpoint to be ready again", k8s_cluster, core, k8s_namespace)

    # The process dies: restartPolicy Always runs it again in the same pod, on the same IP, and
    # the pod is unready until the new run passes the probe.
    before = _pods(core, k8s_namespace)[second]["status"]["conditions"]
    pid = k8s_node.pid(k8s_namespace, second)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        pod = _pods(core, k8s_namespace)[second]
        [status] = pod["status"]["containerStatuses"]
        return status if status["restartCount"] == 1 and status["ready"] else None

    status = _await(restarted, f"{second} to restart", k8s_cluster, core, k8s_namespace)
    assert status["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    after = _pods(core, k8s_namespace)[second]["status"]
    assert after["podIP"] == ips[second]
    # Ready went False and came back: its lastTransitionTime is the second change's.
    assert _condition(after["conditions"], "Ready")["status"] == "True"
    ready_since = _condition(after["conditions"], "Ready")["lastTransitionTime"]
    assert ready_since > _condition(before, "Ready")["lastTransitionTime"]
    _await(both_ready, f"{second}'s endpoint to be ready again", k8s_cluster, core, k8s_namespace)
    assert _get(ips[second], "name") == (200, f"{second}\n")


def test_replaced_and_scaled_down_pods_leave_the_slices(
    web: dict[str, dict[str, Any]], k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str
) -> None:
    """A deleted pod's endpoint goes, its replacement's (a new IP) comes; scaling to 1 drops one."""
    core, apps = client.CoreV1Api(k8s_api), client.AppsV1Api(k8s_api)
    ips = {name: pod["status"]["podIP"] for name, pod in web.items()}
    gone, kept = sorted(web)
    core.delete_namespaced_pod(gone, k8s_namespace, _preload_content=False)

    def replaced() -> dict[str, bool] | None:
        endpoints = _endpoints(k8s_cluster, k8s_namespace)
        ok = len(endpoints) == 2 and all(endpoints.values()) and ips[gone] not in endpoints
        return endpoints if ok else None

    endpoints = _await(replaced, "the replacement's endpoint", k8s_cluster, core, k8s_namespace)
    [new] = set(endpoints) - {ips[kept]}
    [replacement] = [p for p in _pods(core, k8s_namespace).values() if p["status"]["podIP"] == new]
    assert replacement["metadata"]["name"] not in (gone, kept)
    assert _get(new, "name") == (200, f"{replacement['metadata']['name']}\n")

    apps.patch_namespaced_deployment_scale(
        APP, k8s_namespace, {"spec": {"replicas": 1}}, _preload_content=False
    )

    def one_left() -> dict[str, bool] | None:
        endpoints = _endpoints(k8s_cluster, k8s_namespace)
        return endpoints if len(endpoints) == 1 and all(endpoints.values()) else None

    [left] = _await(one_left, "a single endpoint", k8s_cluster, core, k8s_namespace)
    [pod] = _pods(core, k8s_namespace).values()
    assert pod["status"]["podIP"] == left


def test_exec_and_tcp_probes_gate_readiness(
    k8s_cluster: Cluster, k8s_api: Any, k8s_namespace: str, k8s_node: Node
) -> None:
    """An exec probe (with the container's env) and a tcpSocket probe on the pod IP."""
    core = client.CoreV1Api(k8s_api)
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    pod = {
        "metadata": {"name": "probed"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "worker",
                    "image": "busybox:1.36",
                    "command": ["sleep", "300"],
                    "env": [{"name": "MARKER", "value": "go"}],
                    "readinessProbe": {
                        "exec": {"command": ["sh", "-c", 'test -f "$MARKER"']},
                        "periodSeconds": 1,
                    },
                },
                {
                    "name": "listener",
                    "image": "python:3.11-slim",
                    "command": ["python3", "-m", "http.server", "--bind", "$(POD_IP)", "9090"],
                    "env": [pod_ip],
                    "readinessProbe": {"tcpSocket": {"port": 9090}, "periodSeconds": 1},
                },
            ],
        },
    }
    core.create_namespaced_pod(k8s_namespace, pod, _preload_content=False)

    def readiness() -> dict[str, bool]:
        status = _data(
            core.read_namespaced_pod_status("probed", k8s_namespace, _preload_content=False)
        )["status"]
        found = {c["name"]: c["ready"] for c in status.get("containerStatuses") or []}
        ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
        found["pod"] = bool(ready) and ready[0]["status"] == "True"
        return found

    def listener_only() -> bool:
        return readiness() == {"worker": False, "listener": True, "pod": False}

    _await(listener_only, "the tcpSocket probe to pass", k8s_cluster, core, k8s_namespace)
    (k8s_node.pod_dir(k8s_namespace, "probed") / "go").touch()

    def all_ready() -> bool:
        return readiness() == {"worker": True, "listener": True, "pod": True}

    _await(all_ready, "the exec probe to pass", k8s_cluster, core, k8s_namespace)
