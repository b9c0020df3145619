"""Two real tritonservers as pods of a Deployment behind a Service, switched by the operator.

The node helper runs each pod's tritonserver (the nvidia-pytriton wheel's, serving rag-sim at
the test time scale) bound to the pod's own IP; the real endpointslice controller lists the
ready pods; the real `compass operator` process switches every ready pod behind the Service
(`spec.routing.service`) and reads each pod's /metrics. Every assertion about what is served
asks the pods themselves, at their pod IPs.

The image's default configuration is FASTEST and the policy's idle choice is ACCURATE, so a pod
that serves ACCURATE after it (re)started was switched by the operator, not by its defaults;
and a restarted or new pod, whatever its name, never flips the healthy one to its default.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import Cluster, wait_for
from e2e_shared import ACCURATE_NAME, FAST_NAME, Policies, service_policy_spec
from kubernetes import client
from tls_certs import make_tls

from compass.commands.main import main
from compass.dataplane.load import RequestRecord, run_load
from compass.dataplane.triton import GrpcTls, RoutingError, TritonRouter
from compass.domain.evaluation import Config
from compass.domain.space import config_key
from compass_dev.clusterdemo import condition
from compass_dev.devnode import Node
from compass_dev.local_triton import TritonInstallation
from compass_dev.podenv import LocalImage
from compass_dev.scenarios import ACCURATE, FASTEST, TEST_TIME_SCALE, rag_sim_triton
from tiers import require_tritonserver

IMAGE = "compass-rag-sim:test"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
# Per pod, more than ACCURATE serves (~30/s) and less than FASTEST (~50/s): the queue builds on
# ACCURATE, so the policy must go to FASTEST, and drains there. Two pods: twice the total.
POD_QPS, LOAD_S = 45.0, 3.0
START_S = 90  # two tritonservers starting at once on a busy 2-core machine
STEP_S = 30  # a decision or a few, a probe period, a controller sync
FAST_KEY, ACCURATE_KEY = config_key(FASTEST), config_key(ACCURATE)


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rag_image(k8s_node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The image IMAGE on the node: the wheel's tritonserver serving rag-sim, FASTEST by default."""
    # One repository, shared read-only by every pod: each tritonserver keeps its own router
    # state (keyed by its process), so the pods are still independent servers.
    require_tritonserver()
    installation = TritonInstallation.find()
    workdir = tmp_path_factory.mktemp("rag-sim-image")
    repository = rag_sim_triton(workdir, TEST_TIME_SCALE, FASTEST).repository
    # The addresses and ports are the pod's: its args say those.
    entrypoint = installation.server_command(repository)
    env = installation.environment()
    k8s_node.images[IMAGE] = LocalImage(entrypoint=entrypoint, env=env)
    yield IMAGE
    del k8s_node.images[IMAGE]


@dataclass
class TritonPods:
    """A Deployment of rag-sim tritonservers behind a Service of the same name."""

    cluster: Cluster
    api: Any
    namespace: str
    app: str
    routers: dict[str, TritonRouter] = field(default_factory=dict)
    # TLS to the pods' gRPC port, where they take only that (the test's own clients use it).
    tls: GrpcTls | None = None

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    def create(self, replicas: int, extra_args: tuple[str, ...] = ()) -> None:
        """The Service and the Deployment (``extra_args``: more tritonserver flags)."""
        ports = [("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT)]
        service = {
            "metadata": {"name": self.app},
            "spec": {
                "selector": {"app": self.app},
                "ports": [{"name": n, "port": p, "targetPort": n} for n, p in ports],
            },
        }
        container = {
            "name": "triton",
            "image": IMAGE,
            # Each pod binds its own IP ($(POD_IP), the downward API's status.podIP).
            "args": [
                "--http-address=$(POD_IP)",
                f"--http-port={HTTP_PORT}",
                "--grpc-address=$(POD_IP)",
                f"--grpc-port={GRPC_PORT}",
                "--metrics-address=$(POD_IP)",
                f"--metrics-port={METRICS_PORT}",
                *extra_args,
            ],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": n, "containerPort": p} for n, p in ports],
            "readinessProbe": {
                "httpGet": {"path": "/v2/health/ready", "port": "http"},
                "periodSeconds": 1,
                # A hung server stays listed ~10 s (a dead one leaves at once): time enough for
                # the operator to name it lagging.
                "failureThreshold": 10,
            },
        }
        deployment = {
            "metadata": {"name": self.app},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": self.app}},
                "template": {
                    "metadata": {"labels": {"app": self.app}},
                    "spec": {"containers": [container]},
                },
            },
        }
        self.core.create_namespaced_service(self.namespace, service, _preload_content=False)
        self.apps.create_namespaced_deployment(self.namespace, deployment, _preload_content=False)

    def scale(self, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(
            self.app, self.namespace, {"spec": {"replicas": replicas}}, _preload_content=False
        )

    def delete(self) -> None:
        """Scale to 0 (the pods go at once), delete both objects, wait for the pods to go."""
        for router in self.routers.values():
            router.close()
        self.scale(0)
        self.apps.delete_namespaced_deployment(
            self.app, self.namespace, propagation_policy="Background", _preload_content=False
        )
        self.core.delete_namespaced_service(self.app, self.namespace, _preload_content=False)
        wait_for(lambda: not self.pods(), 30, f"the pods of {self.app} to go", 0.2)

    def pods(self) -> dict[str, dict[str, Any]]:
        """The app's pods that are not being deleted, by name."""
        response: Any = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"app={self.app}", _preload_content=False
        )
        listing = json.loads(response.data)
        return {
            p["metadata"]["name"]: p
            for p in listing["items"]
            if not p["metadata"].get("deletionTimestamp")
        }

    def endpoints(self) -> dict[str, tuple[str, bool]]:
        """The Service's EndpointSlice entries: pod name -> (address, ready)."""
        path = (
            f"/apis/discovery.k8s.io/v1beta1/namespaces/{self.namespace}/endpointslices"
            f"?labelSelector=kubernetes.io/service-name%3D{self.app}"
        )
        return {
            endpoint["targetRef"]["name"]: (
                endpoint["addresses"][0],
                bool(endpoint["conditions"].get("ready")),
            )
            for piece in self.cluster.request(path)["items"]
            for endpoint in piece.get("endpoints") or []
        }

    def ready(self, count: int) -> dict[str, str] | None:
        """pod -> IP once exactly ``count`` pods run and all are ready endpoints, else None."""
        pods = self.pods()
        ips = {name: pod["status"].get("podIP") for name, pod in pods.items()}
        endpoints = self.endpoints()
        ok = (
            len(pods) == count
            and endpoints == {name: (ip, True) for name, ip in ips.items()}
            and all(_container(pod).get("ready") for pod in pods.values())
        )
        return ips if ok else None

    def router(self, ip: str) -> TritonRouter:
        """A client of the pod at ``ip`` (straight to it: there is no kube-proxy)."""
        if ip not in self.routers:
            self.routers[ip] = TritonRouter(
                f"{ip}:{GRPC_PORT}", timeout_s=5, attempts=1, tls=self.tls
            )
        return self.routers[ip]

    def active(self, ip: str) -> str | None:
        """What the pod's control model says it serves (None: it does not answer)."""
        try:
            return self.router(ip).active_config()
        except RoutingError:
            return None

    def serves(self, ip: str) -> str:
        """The configuration that served one real request at the pod."""
        return self.router(ip).infer({"sample": 0}).config

    def explain(self, policies: Policies, policy: str | None) -> str:
        """The pods, slices, policy status and events, for a failure message."""
        pods = {
            name: (
                pod["status"].get("podIP"),
                _container(pod).get("ready"),
                _container(pod).get("restartCount"),
                {ip: self.active(ip) for ip in [pod["status"].get("podIP")] if ip},
            )
            for name, pod in self.pods().items()
        }
        status = policies.status(policy) if policy else {}
        events = self.cluster.kubectl("get", "events", "-n", self.namespace).stdout
        return (
            f"pods (ip, ready, restarts, serves): {pods}\nendpoints: {self.endpoints()}\n"
            f"policy status: {json.dumps(status, indent=1)}\nevents:\n{events}"
        )


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("containerStatuses") or [{}]
    return dict(statuses[0])


@pytest.fixture
def triton_pods(
    rag_image: str, k8s_cluster: Cluster, k8s_api: Any, namespace: str
) -> Iterator[Callable[..., TritonPods]]:
    """Make Deployments (with their Services) of rag-sim pods; all deleted after the test."""
    made: list[TritonPods] = []

    def make(app: str, replicas: int, extra_args: tuple[str, ...] = ()) -> TritonPods:
        pods = TritonPods(k8s_cluster, k8s_api, namespace, app)
        pods.create(replicas, extra_args)
        made.append(pods)
        return pods

    yield make
    for pods in made:
        pods.delete()


# ---------------------------------------------------------------------------- helpers


def _await(
    condition_: Callable[[], Any],
    timeout_s: float,
    what: str,
    pods: TritonPods,
    policies: Policies,
    policy: str | None = None,
) -> Any:
    """wait_for, and on a timeout what the pods, slices and the policy say."""
    try:
        return wait_for(condition_, timeout_s, what, 0.1)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{pods.explain(policies, policy)}") from None


def wait_serving(
    pods: TritonPods,
    policies: Policies,
    policy: str,
    config: Config,
    count: int,
    timeout_s: float,
) -> dict[str, Any]:
    """The policy's status once it, ``count`` ready pods (asked directly) and PodsServing agree."""
    key = config_key(config)

    def done() -> dict[str, Any] | None:
        ips = pods.ready(count)
        if ips is None or any(pods.active(ip) != key for ip in ips.values()):
            return None
        status = policies.status(policy)
        active = (status.get("active") or {}).get("config")
        routing = status.get("routing") or {}
        ok = (
            active is not None
            and config_key(active) == key
            and (routing.get("pods"), routing.get("serving")) == (count, count)
            and condition(status, "PodsServing").get("status") == "True"
        )
        return status if ok else None

    wanted = f"{policy}: {count} pods serving {config['generator_model']}"
    return dict(_await(done, timeout_s, wanted, pods, policies, policy))


# ---------------------------------------------------------------------------- tests


def test_both_pods_switch_together_under_load(
    triton_pods: Callable[[str, int], TritonPods], policies: Policies
) -> None:
    """Both pods climb to ACCURATE, go to FASTEST under load and back, no request failing."""
    rag = triton_pods("rag", 2)
    ips: dict[str, str] = _await(lambda: rag.ready(2), START_S, "2 ready pods", rag, policies)
    assert len(set(ips.values())) == 2, ips
    for ip in ips.values():
        assert rag.serves(ip) == FAST_KEY  # the image's default, before any policy
    [piece] = rag.cluster.request(
        f"/apis/discovery.k8s.io/v1beta1/namespaces/{rag.namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name%3D{rag.app}"
    )["items"]
    assert {p["name"]: p["port"] for p in piece["ports"]} == {
        "http": HTTP_PORT,
        "grpc": GRPC_PORT,
        "metrics": METRICS_PORT,
    }

    # Idle: the policy starts from what the pods serve and climbs to ACCURATE, on both.
    policies.create("rag", service_policy_spec("rag"))
    status = wait_serving(rag, policies, "rag", ACCURATE, 2, STEP_S)
    assert status["active"]["name"] == ACCURATE_NAME
    assert status["routing"] == {"pods": 2, "serving": 2, "lagging": []}
    serving = condition(status, "PodsServing")
    assert (serving["reason"], serving["message"]) == (
        "AllPodsServing",
        f"2/2 pods serve {ACCURATE_NAME}",
    )
    assert condition(status, "MetricsAvailable")["status"] == "True"
    assert condition(status, "Ready")["status"] == "True"
    for ip in ips.values():
        assert rag.serves(ip) == ACCURATE_KEY

    # Open-loop load over both pods, more than ACCURATE serves on each: both go to FASTEST.
    urls = [f"{ip}:{GRPC_PORT}" for ip in ips.values()]
    total_qps = POD_QPS * len(urls)
    arrivals = [i / total_qps for i in range(int(total_qps * LOAD_S))]
    assignment = [i % len(urls) for i in range(len(arrivals))]
    records: list[RequestRecord] = []
    loader = threading.Thread(
        target=lambda: records.extend(
            run_load(urls, arrivals, lambda i: {"sample": i % 100}, replicas=assignment)
        )
    )
    loader.start()
    try:
        during = wait_serving(rag, policies, "rag", FASTEST, 2, LOAD_S + 10)
    finally:
        loader.join()
    assert during["active"]["name"] == FAST_NAME
    assert "over" in during["lastSwitchReason"], during["lastSwitchReason"]
    assert len(records) == len(arrivals)
    assert not [r.error for r in records if r.error]
    # Each pod served both configurations within the load: the switch reached both under load.
    for k in range(len(urls)):
        served = {r.config for r, pod in zip(records, assignment, strict=True) if pod == k}
        assert served == {ACCURATE_KEY, FAST_KEY}, (k, served)
    switched = [e["message"] for e in policies.wait_events("rag", "ConfigurationSwitched", 2)]
    assert any(m.startswith(f"{ACCURATE_NAME} -> {FAST_NAME}: queue ") for m in switched), switched

    # The load is over: after the cooldown the policy climbs back, on both pods.
    final = wait_serving(rag, policies, "rag", ACCURATE, 2, STEP_S)
    assert final["switches"] >= 3
    for ip in ips.values():
        assert rag.serves(ip) == ACCURATE_KEY


# A pod that (re)starts on its image's default ties 1:1 with the other of two: whichever sorts
# first by name, the policy keeps what it chose (RouterFleet.active_config's expectation) and
# brings the restarted pod to it, never the healthy pod to the default.
@pytest.mark.parametrize(
    "killed", [pytest.param(1, id="last-by-name"), pytest.param(0, id="first-by-name")]
)
def test_a_killed_pod_restarts_and_catches_up(
    killed: int,
    triton_pods: Callable[[str, int], TritonPods],
    policies: Policies,
    k8s_node: Node,
) -> None:
    """A SIGKILLed tritonserver restarts in its pod and is switched to ACCURATE at once."""
    crash = triton_pods("crash", 2)
    ips: dict[str, str] = _await(lambda: crash.ready(2), START_S, "2 ready pods", crash, policies)
    policies.create("crash", service_policy_spec("crash"))
    before = wait_serving(crash, policies, "crash", ACCURATE, 2, STEP_S)
    victim = sorted(ips)[killed]
    [survivor] = set(ips) - {victim}
    pid = k8s_node.pid(crash.namespace, victim)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    seen: list[tuple[float, Any, str]] = []  # (s, status.routing, PodsServing message) as it went
    answers: list[str | None] = []  # what the victim said it served, each change once
    ready_at: list[float] = []  # when the restarted victim was first seen ready

    def recovered() -> dict[str, Any] | None:
        # The survivor serves the active configuration all along.
        assert crash.active(ips[survivor]) == ACCURATE_KEY, crash.explain(policies, "crash")
        status = policies.status("crash")
        routing, pods_serving = status.get("routing") or {}, condition(status, "PodsServing")
        seen.append((time.monotonic() - killed_at, routing, pods_serving.get("message", "")))
        pod = crash.pods().get(victim)
        if pod is None or not _container(pod).get("restartCount"):
            return None
        answer = crash.active(ips[victim])
        if not answers or answers[-1] != answer:
            answers.append(answer)
        if _container(pod).get("ready") and not ready_at:
            ready_at.append(time.monotonic())
        ok = (
            ready_at
            and answer == ACCURATE_KEY
            and (routing.get("pods"), routing.get("serving")) == (2, 2)
            and pods_serving.get("status") == "True"
        )
        return status if ok else None

    after = _await(
        recovered, START_S, f"{victim} to restart and catch up", crash, policies, "crash"
    )
    caught_up_s = time.monotonic() - ready_at[0]
    print(f"status while down: {seen}\nthe victim answered: {answers}, {caught_up_s:.1f} s")
    assert caught_up_s < 3.5  # within a few 1 s intervals of being ready again
    pod = crash.pods()[victim]
    assert pod["status"]["podIP"] == ips[victim]  # the same pod, restarted in place
    assert _container(pod)["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    for ip in ips.values():
        assert crash.serves(ip) == ACCURATE_KEY
    # Caught up by the repeated switch: the policy itself never moved.
    assert after["switches"] == before["switches"]
    assert after["active"]["name"] == ACCURATE_NAME
    # While the victim was down the status said so: one pod left, or the victim named lagging.
    down = [
        (t, routing, message)
        for t, routing, message in seen
        if routing.get("pods") == 1 or victim in message
    ]
    assert down, seen
    print(f"PodsLagging events: {[e['message'] for e in policies.events('crash', 'PodsLagging')]}")


def test_a_new_replica_serves_the_active_configuration(
    triton_pods: Callable[[str, int], TritonPods], policies: Policies
) -> None:
    """Scaled from 1 to 2: the new pod serves ACCURATE within a few intervals of being ready."""
    scaled = triton_pods("scaled", 1)
    [(old, old_ip)] = _await(
        lambda: scaled.ready(1), START_S, "1 ready pod", scaled, policies
    ).items()
    policies.create("scaled", service_policy_spec("scaled"))
    before = wait_serving(scaled, policies, "scaled", ACCURATE, 1, STEP_S)
    assert before["routing"] == {"pods": 1, "serving": 1, "lagging": []}
    scaled.scale(2)

    old_served: set[str | None] = set()
    answers: list[tuple[float, str | None]] = []  # the new pod's, from when it was seen ready
    ready_at: list[float] = []

    def caught_up() -> dict[str, str] | None:
        old_served.add(scaled.active(old_ip))
        ips = scaled.ready(2)
        if ips is None:
            return None
        [new] = set(ips) - {old}
        if not ready_at:
            ready_at.append(time.monotonic())
        answer = scaled.active(ips[new])
        answers.append((time.monotonic() - ready_at[0], answer))
        return ips if answer == ACCURATE_KEY else None

    ips = _await(caught_up, START_S, "the new pod to serve ACCURATE", scaled, policies, "scaled")
    [new] = set(ips) - {old}
    status = wait_serving(scaled, policies, "scaled", ACCURATE, 2, STEP_S)
    print(f"new pod {new} answered (s after ready, config): {answers}; {old} served {old_served}")
    assert old_served == {ACCURATE_KEY}, f"{new} joined before {old}, which served {old_served}"
    assert answers[-1][0] < 3.5, answers  # within a few 1 s intervals of being ready
    assert status["routing"] == {"pods": 2, "serving": 2, "lagging": []}
    assert status["switches"] == before["switches"]
    for ip in ips.values():
        assert scaled.serves(ip) == ACCURATE_KEY


def test_a_policy_planned_for_the_service_applies_as_written_and_serves(
    triton_pods: Callable[[str, int], TritonPods],
    policies: Policies,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`compass plan --service NAME --namespace NS` writes a manifest that the API server takes
    and the operator serves as written: Ready, its routing on the Service's pods."""
    planned = triton_pods("planned", 1)
    _await(lambda: planned.ready(1), START_S, "1 ready pod", planned, policies)
    profiles = [
        {
            "config": entry["config"],
            "accuracy": entry["accuracy"],
            "latency_mean_ms": entry["latencyMeanMs"],
            "latency_p95_ms": entry["latencyP95Ms"],
        }
        for entry in service_policy_spec("planned")["front"]
    ]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": profiles}))
    argv = ["plan", "--profiles", "profiles.json", "--slo-ms", "150", "--service", "planned"]
    assert main([*argv, "--namespace", policies.namespace, "--output", "planned.yaml"]) == 0
    manifest = yaml.safe_load((tmp_path / "planned.yaml").read_text())
    assert manifest["metadata"] == {"name": "planned", "namespace": policies.namespace}
    policies.create(manifest["metadata"]["name"], manifest["spec"])

    def serving() -> dict[str, Any] | None:
        status = policies.status("planned")
        routing = status.get("routing") or {}
        ready = condition(status, "Ready").get("status") == "True"
        return status if ready and (routing.get("pods"), routing.get("serving")) == (1, 1) else None

    status = _await(
        serving, START_S, "the planned policy to be Ready", planned, policies, "planned"
    )
    [ip] = planned.ready(1).values()
    assert planned.active(ip) == config_key(status["active"]["config"])


def test_a_hung_pod_is_named_lagging_until_it_answers_again(
    triton_pods: Callable[[str, int], TritonPods], policies: Policies, k8s_node: Node
) -> None:
    """A pod listed ready that does not answer is named lagging; the other keeps serving."""
    # SIGSTOP, not SIGKILL: a dead container is unready at once and simply leaves the slice,
    # while a stopped one stays listed until its probe has failed ten times.
    hung = triton_pods("hung", 2)
    ips: dict[str, str] = _await(lambda: hung.ready(2), START_S, "2 ready pods", hung, policies)
    policies.create("hung", service_policy_spec("hung"))
    before = wait_serving(hung, policies, "hung", ACCURATE, 2, STEP_S)
    victim, survivor = sorted(ips)  # a stopped server keeps its state: no tie to break
    pid = k8s_node.pid(hung.namespace, victim)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:

        def lagging() -> dict[str, Any] | None:
            assert hung.active(ips[survivor]) == ACCURATE_KEY, hung.explain(policies, "hung")
            status = policies.status("hung")
            return status if condition(status, "PodsServing").get("status") == "False" else None

        status = _await(lagging, STEP_S, f"{victim} reported lagging", hung, policies, "hung")
        reported_s = time.monotonic() - stopped_at
        print(f"reported lagging {reported_s:.1f} s after SIGSTOP")
        # One silent pod costs a tick about one call's timeout (1 s), not one per call: the
        # policy keeps deciding for the others.
        assert reported_s < 7, reported_s
        [lag] = status["routing"]["lagging"]
        assert (status["routing"]["pods"], status["routing"]["serving"]) == (2, 1)
        assert lag["name"] == victim
        assert ips[victim] in lag["reason"], lag
        pods_serving = condition(status, "PodsServing")
        assert pods_serving["reason"] == "PodsLagging"
        assert pods_serving["message"].startswith(f"1/2 pods serve {ACCURATE_NAME}; lagging: ")
        assert victim in pods_serving["message"]
        # One Warning or more: on a busy machine a slow answer may be named lagging again.
        events = policies.wait_events("hung", "PodsLagging")
        assert all(e["type"] == "Warning" and victim in e["message"] for e in events), events
    finally:
        os.kill(pid, signal.SIGCONT)
    after = wait_serving(hung, policies, "hung", ACCURATE, 2, STEP_S)
    assert after["switches"] == before["switches"]
    for ip in ips.values():
        assert hung.serves(ip) == ACCURATE_KEY
    assert policies.wait_events("hung", "PodsServing")


def test_routers_over_mutual_tls_from_a_labelled_secret(
    triton_pods: Callable[..., TritonPods],
    policies: Policies,
    k8s_api: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    """A pod whose gRPC port takes only mutual TLS, its certificate naming the Service: the
    policy's spec.routing.tls names a Secret; until the Secret carries the consent label the
    routers are unreachable and the Ready condition names the Secret and the label; once
    labelled, the policy switches the pod over TLS."""
    server_name = f"tls.{namespace}.svc"
    certificates = make_tls(tmp_path, server_san=f"DNS:{server_name}")
    pods = triton_pods("tls", 1, certificates.triton_args())
    pods.tls = GrpcTls(
        certificates.ca.read_bytes(),
        certificates.client_cert.read_bytes(),
        certificates.client_key.read_bytes(),
        server_name,
    )
    ips = _await(lambda: pods.ready(1), START_S, "1 ready pod", pods, policies)
    [ip] = ips.values()
    assert pods.active(ip) == FAST_KEY  # over TLS: the pod answers the test's own client
    secret = {
        "metadata": {"name": "triton-tls"},
        "stringData": {
            "ca.crt": certificates.ca.read_text(),
            "tls.crt": certificates.client_cert.read_text(),
            "tls.key": certificates.client_key.read_text(),
        },
    }
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_secret(namespace, secret, _preload_content=False)
    spec = service_policy_spec("tls")
    spec["routing"]["tls"] = {
        "secretRef": {"name": "triton-tls"},
        "certKey": "tls.crt",
        "keyKey": "tls.key",
        "serverName": server_name,
    }
    policies.create("tls", spec)

    def refused() -> dict[str, Any] | None:
        ready = condition(policies.status("tls"), "Ready")
        message = ready.get("message") or ""
        return ready if "is not labelled compass.io/metrics-credentials" in message else None

    ready = _await(refused, STEP_S, "the unlabelled Secret named", pods, policies, "tls")
    assert ready["reason"] == "TritonUnreachable", ready
    assert f"Secret {namespace}/triton-tls (spec.routing.tls.secretRef)" in ready["message"]
    assert pods.active(ip) == FAST_KEY  # nothing was switched meanwhile
    core.patch_namespaced_secret(
        "triton-tls",
        namespace,
        {"metadata": {"labels": {"compass.io/metrics-credentials": "true"}}},
        _preload_content=False,
    )
    # Idle, the policy climbs to the most accurate member: over TLS, to the pod.
    status = wait_serving(pods, policies, "tls", ACCURATE, 1, STEP_S)
    assert condition(status, "Ready").get("status") == "True", status
