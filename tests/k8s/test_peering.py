"""Two `compass operator` processes with kopf peering on one namespace: only one acts.

A real API server, the chart's kopf peering CRDs, a KopfPeering object, a real tritonserver with
rag-sim (the tier's fixtures, conftest.py) and one ParetoPolicy: the risk peering
guards against is two operators switching the same router. Each process has its own /metrics
and log, so which one decides is observable: the one started first acts (its priority is
higher, see compass.controllers.manager.automatic_priority), the other stays paused; SIGKILL the active
one and the standby takes over once the dead one's keep-alive expires, carrying on from the
status without a flip. With equal priorities kopf pauses both until one leaves.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, wait_for
from e2e_shared import (
    ACCURATE_NAME,
    GROUP,
    POLICY_PLURAL,
    VERSION,
    Policies,
    policy_spec,
    wait_active,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_process import Operator
from partition import PartitionableProxy

from compass.controllers.manager import missing_peering_objects
from compass.controllers.policy_status import STATUS_HEARTBEAT_S
from compass.dataplane.triton import TritonRouter
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import ACCURATE, FASTEST

REPO = Path(__file__).resolve().parents[2]
PEERING_CRDS = REPO / "charts" / "compass-operator" / "crds" / "kopf-peerings.yml"
# Short, so that a takeover after a kill is quick; kopf sends a keep-alive 5-10 s before it
# runs out (at least every second), so a live peer never expires.
LIFETIME_S = 10
# After the dead peer's deadline: kopf re-lists the policies, the timer starts, the first tick.
RESUME_S = 5.0
DECISIONS = re.compile(r'^compass_reconciles_total\{kind="ParetoPolicy",result="ok"\} (\S+)$', re.M)
# Elastico steps (each reads Triton and may switch it), counted whether or not the status
# write that follows succeeds: what a partitioned operator does is in these.
STEPS = re.compile(r"^compass_decision_seconds_count (\S+)$", re.M)
# kopf's log format: "[2024-05-01 12:00:00,123] kopf... [INFO    ] message".
LOGGED_AT = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] ")
# A logged time is cut to the millisecond.
LOG_RESOLUTION = timedelta(milliseconds=1)
RESUMED = "Resuming operations after the pause"


@pytest.fixture(scope="module")
def crds(crds: None, k8s_cluster: Cluster) -> None:
    """The compass.io CRDs (the tier's crds fixture), and kopf's peering CRDs from the chart's
    crds/, established."""
    k8s_cluster.kubectl("apply", "-f", str(PEERING_CRDS))
    k8s_cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=30s", "crd/kopfpeerings.kopf.dev"
    )


class Peers:
    """Operator processes joining one KopfPeering object, stopped after the test."""

    def __init__(self, cluster: Cluster, api: Any, namespace: str, name: str, logs: Path) -> None:
        self.cluster, self.namespace, self.name, self.logs = cluster, namespace, name, logs
        self.custom: Any = client.CustomObjectsApi(api)
        self.started: list[Operator] = []
        body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": name}}
        self.custom.create_namespaced_custom_object(
            "kopf.dev", "v1", namespace, "kopfpeerings", body, _preload_content=False
        )

    def start(self, identity: str, *args: str, kubeconfig: Path | None = None) -> Operator:
        """`compass operator --peering NAME` as ``identity`` (kopf's POD_ID), once it is a peer;
        through ``kubeconfig`` if given."""
        env = {"POD_ID": identity, "COMPASS_PEERING_LIFETIME_SECONDS": str(LIFETIME_S)}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        operator = Operator(
            self.cluster,
            self.namespace,
            self.logs / f"{identity}.log",
            env=env,
            args=("--peering", self.name, *args),
        )
        self.started.append(operator)
        operator.start()
        wait_for(lambda: identity in self.peers(), 30, f"{identity}'s keep-alive", 0.2)
        return operator

    def peers(self) -> dict[str, Any]:
        """The peering object's status: identity -> priority, lifetime, lastseen."""
        response = self.custom.get_namespaced_custom_object(
            "kopf.dev", "v1", self.namespace, "kopfpeerings", self.name, _preload_content=False
        )
        return dict(json.loads(response.data).get("status") or {})

    def stop_all(self) -> None:
        for operator in self.started:
            operator.stop()


@pytest.fixture
def peers(
    k8s_cluster: Cluster, k8s_api: Any, namespace: str, tmp_path: Path, request: Any
) -> Iterator[Peers]:
    """A fresh peering object for the test (named after it) and the operators that join it."""
    name = request.node.name.replace("_", "-")[:40].strip("-")
    made = Peers(k8s_cluster, k8s_api, namespace, name, tmp_path)
    yield made
    for operator in made.started:
        print(f"{operator.log.name}:\n{operator.tail()}")  # pytest shows it when a test failed
    made.stop_all()


@pytest.fixture
def policies(k8s_api: Any, namespace: str, peers: Peers) -> Iterator[Policies]:
    """Policies of one test, deleted after it while its operators still run (one removes the
    finalizer); where none acts (a failed test), the finalizers are dropped instead."""
    made = Policies(client.CustomObjectsApi(k8s_api), client.CoreV1Api(k8s_api), namespace)
    yield made
    try:
        made.delete_all()
    except TimeoutError:
        for name in made.created:
            with contextlib.suppress(ApiException):
                made.api.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    POLICY_PLURAL,
                    name,
                    {"metadata": {"finalizers": None}},
                    _preload_content=False,
                )
        raise


def log(operator: Operator) -> str:
    """The process's whole log (kopf's debug lines included)."""
    return operator.log.read_text(encoding="utf-8", errors="replace")


def decisions(operator: Operator) -> float:
    """The ParetoPolicy decisions this process made (its compass_reconciles_total)."""
    found = DECISIONS.search(operator.metrics())
    return float(found.group(1)) if found else 0.0


def steps(operator: Operator) -> float:
    """The Elastico steps this process took (STEPS)."""
    found = STEPS.search(operator.metrics())
    return float(found.group(1)) if found else 0.0


def fenced(operator: Operator, namespace: str, policy: str) -> bool:
    """Whether the process says its fence keeps it from acting on the policy."""
    gauge = f'compass_policy_fenced{{namespace="{namespace}",policy="{policy}"}} 1.0'
    return gauge in operator.metrics()


def acts_on(operator: Operator, namespace: str, policy: str) -> bool:
    """Whether this process has published the policy's gauges (only a deciding one does)."""
    return f'namespace="{namespace}",policy="{policy}"' in operator.metrics()


def logged_at(line: str) -> datetime:
    """When kopf logged a line: its "[YYYY-mm-dd HH:MM:SS,mmm]" prefix, local time."""
    stamp = LOGGED_AT.match(line)
    assert stamp, f"no timestamp on {line!r}"
    return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone()


def lines(operator: Operator, needle: str) -> list[str]:
    """The process's log lines that contain needle."""
    return [line for line in log(operator).splitlines() if needle in line]


def lastseen(peer: dict[str, Any]) -> datetime:
    """A peer's last keep-alive (kopf writes UTC; it reads a time without a zone as UTC too)."""
    seen = datetime.fromisoformat(peer["lastseen"])
    return seen if seen.tzinfo else seen.replace(tzinfo=UTC)


def expiry(peer: dict[str, Any]) -> datetime:
    """When a peer's last keep-alive runs out (kopf: lastseen + lifetime, on the same clock)."""
    return lastseen(peer) + timedelta(seconds=peer["lifetime"])


def policies_watch_paused(operator: Operator, namespace: str) -> bool:
    """Whether kopf's last word on this process's ParetoPolicy watch is that it is paused."""
    stream = f"the watch-stream for paretopolicies.v1alpha1.compass.io in '{namespace}'"
    said = [line for line in lines(operator, stream) if " Pausing " in line or " Resuming " in line]
    return bool(said) and " Pausing " in said[-1]


def fresh_keepalive(peers: Peers, identity: str) -> dict[str, Any]:
    """The peer's entry once it renews its keep-alive (every 1-5 s): it expires LIFETIME_S on."""
    seen = peers.peers()[identity]["lastseen"]
    return dict(
        wait_for(
            lambda: (peer := peers.peers()[identity])["lastseen"] != seen and peer,
            2 * LIFETIME_S,
            f"{identity}'s next keep-alive",
            0.05,
        )
    )


def test_only_the_oldest_acts_and_the_standby_takes_over_after_a_kill(
    triton: LocalTriton,
    router: TritonRouter,
    peers: Peers,
    policies: Policies,
) -> None:
    first = peers.start("operator-a")
    second = peers.start("operator-b")
    priorities = {identity: peer["priority"] for identity, peer in peers.peers().items()}
    assert priorities["operator-a"] > priorities["operator-b"], priorities
    assert {peer["lifetime"] for peer in peers.peers().values()} == {LIFETIME_S}

    policies.create("shared", policy_spec(triton))
    # Idle: the policy climbs from FASTEST (what the router serves) to ACCURATE after 2 s.
    before = wait_active(policies, "shared", router, ACCURATE, 30)
    wait_for(lambda: decisions(first) >= 5, 30, "five decisions by operator-a", 0.2)
    assert decisions(second) == 0
    assert acts_on(first, policies.namespace, "shared")
    assert not acts_on(second, policies.namespace, "shared")
    # The standby says why it does nothing: kopf keeps its policy watch paused on the peering.
    paused = (
        f"Pausing the watch-stream for paretopolicies.v1alpha1.compass.io in '{policies.namespace}'"
    )
    assert paused in log(second), log(second)
    assert f"blockers: {peers.name}@{policies.namespace}" in log(second)
    assert before["switches"] == 1

    first.kill()
    # Its last keep-alive stays in the peering object until it runs out (then operator-b
    # removes it): read now, it is the one whose expiry operator-b has to wait for.
    assert "operator-a" in peers.peers(), "the killed peer vanished before its keep-alive ran out"
    expires = expiry(peers.peers()["operator-a"])

    def took_over() -> bool:
        count = decisions(second)
        # A decision seen before the expiry was made before it: two acting operators.
        assert count == 0 or datetime.now(UTC) >= expires, "operator-b acted too early"
        return count > 0

    # The timeout bounds a hang only (the lifetime, the re-listing, the first tick, a margin).
    wait_for(took_over, LIFETIME_S + RESUME_S + 30, "operator-b's takeover", 0.1)
    # Not before the dead peer's keep-alive had expired: operator-b's own word for its resumption.
    resumed = lines(second, RESUMED)
    assert resumed, log(second)
    assert all(logged_at(line) + LOG_RESOLUTION >= expires for line in resumed), (expires, resumed)

    # It carries on from the status: the same configuration, no switch, no flip of the router.
    taken = decisions(second)
    wait_for(lambda: decisions(second) >= taken + 3, 30, "three more decisions by operator-b", 0.2)
    # Its observations reach the status at the latest at the heartbeat (routine fields are not
    # written every tick).
    after = wait_for(
        lambda: (
            status
            if (status := policies.status("shared"))["lastObservationTime"]
            > before["lastObservationTime"]
            else None
        ),
        STATUS_HEARTBEAT_S + 20,
        "operator-b's observations in the status",
        0.2,
    )
    assert router.active_config() == config_key(ACCURATE)
    assert after["switches"] == before["switches"] == 1
    assert after["active"]["name"] == ACCURATE_NAME
    assert acts_on(second, policies.namespace, "shared")
    assert len(policies.events("shared", "ConfigurationSwitched")) == 1
    assert set(peers.peers()) == {"operator-b"}, "the dead peer was not cleaned up"


def test_a_partitioned_actor_stops_switching_within_one_lifetime(
    triton: LocalTriton,
    router: TritonRouter,
    peers: Peers,
    policies: Policies,
    k8s_cluster: Cluster,
    tmp_path: Path,
) -> None:
    """Cut the acting operator off from the API server but not from Triton: kopf alone would let
    it go on switching beside the standby that takes over; its fence stops it first."""
    proxy = PartitionableProxy(k8s_cluster.api_port)
    try:
        kubeconfig = proxy.kubeconfig(k8s_cluster.kubeconfig, tmp_path / "via-proxy.kubeconfig")
        first = peers.start("cut-a", kubeconfig=kubeconfig)
        second = peers.start("cut-b")
        policies.create("cut", policy_spec(triton))
        wait_active(policies, "cut", router, ACCURATE, 30)
        wait_for(lambda: steps(first) >= 3, 30, "three steps by cut-a", 0.2)
        assert not fenced(first, policies.namespace, "cut")

        fresh_keepalive(peers, "cut-a")
        proxy.cut()
        time.sleep(0.5)  # a keep-alive in flight at the cut has landed or is lost by now
        # The last keep-alive the API server accepted: cut-b resumes once it runs out.
        expires = expiry(peers.peers()["cut-a"])
        wait_for(lambda: datetime.now(UTC) >= expires, 2 * LIFETIME_S, "the expiry", 0.1)
        frozen = steps(first)
        wait_for(lambda: decisions(second) >= 3, LIFETIME_S + RESUME_S + 30, "cut-b acting", 0.1)
        # Still reaching Triton, cut-a took no step since its lifetime ran out, and says why.
        assert steps(first) == frozen
        assert first.process is not None, "cut-a never started"
        assert first.process.poll() is None, "cut-a exited"
        assert fenced(first, policies.namespace, "cut"), first.tail()
        assert lines(first, "fenced: the API server has accepted no peering keep-alive")

        # Reconnected, it is a peer again and the fence opens (kopf hands the policy back to the
        # older peer, whose priority is higher).
        proxy.heal()
        wait_for(
            lambda: not fenced(first, policies.namespace, "cut") and steps(first) > frozen,
            3 * LIFETIME_S,
            "cut-a acting again",
            0.2,
        )
        assert lines(first, "fence open: the API server accepts this operator's keep-alives")
    finally:
        proxy.close()


def test_equal_priorities_pause_both_until_one_leaves(
    triton: LocalTriton,
    router: TritonRouter,
    peers: Peers,
    policies: Policies,
) -> None:
    """kopf's rule, and why compass gives every process its own priority by default."""
    first = peers.start("tie-a", "--priority", "7")
    second = peers.start("tie-b", "--priority", "7")
    spec = policy_spec(triton)
    policies.create("tied", spec)
    # What an acting operator needs to decide and climb: a tick, then the cooldown.
    hysteresis = spec["hysteresis"]
    cooldown = max(hysteresis["upscaleCooldownSeconds"], hysteresis["downscaleCooldownSeconds"])
    would_have_acted = datetime.now(UTC) + timedelta(seconds=spec["intervalSeconds"] + cooldown)
    for operator in (first, second):
        wait_for(
            lambda op=operator: "Possibly conflicting operators with the same priority" in log(op),
            30,
            f"{operator.log.name}'s warning",
        )
        # Why neither acts: kopf stopped watching the policies in both.
        wait_for(
            lambda op=operator: policies_watch_paused(op, policies.namespace),
            30,
            f"{operator.log.name} pausing its ParetoPolicy watch",
        )
    # A keep-alive of each from after that time: both still running, still tied, still paused.
    wait_for(
        lambda: all(lastseen(peer) > would_have_acted for peer in peers.peers().values()),
        60,
        "a keep-alive of each peer after an acting one would have decided",
        0.2,
    )
    for operator in (first, second):
        assert policies_watch_paused(operator, policies.namespace), log(operator)
    assert decisions(first) == decisions(second) == 0
    assert not policies.status("tied")
    assert router.active_config() == config_key(FASTEST)
    assert not lines(second, RESUMED)

    # A clean exit removes the peer at once: the other resumes before tie-a's keep-alive (just
    # renewed, so LIFETIME_S away) could have run out, which is what it would wait for otherwise.
    expires = expiry(fresh_keepalive(peers, "tie-a"))
    leaving = datetime.now().astimezone()
    first.stop()
    assert "tie-a" not in peers.peers(), "tie-a did not remove itself on its way out"
    [resumed] = wait_for(lambda: lines(second, RESUMED), 2 * LIFETIME_S, "tie-b resuming", 0.1)
    assert leaving <= logged_at(resumed) + LOG_RESOLUTION, "tie-b resumed before tie-a left"
    assert logged_at(resumed) < expires, "tie-b waited for tie-a's keep-alive to run out"
    wait_for(lambda: decisions(second) > 0, 30, "tie-b deciding", 0.1)
    wait_active(policies, "tied", router, ACCURATE, 30)


def test_missing_peering_objects_are_named(k8s_api: Any, namespace: str) -> None:
    """What `compass operator --peering` checks first: kopf would stay paused, silently,
    without its peering object."""
    assert missing_peering_objects(k8s_api, "absent", False, [namespace]) == [namespace]
    assert missing_peering_objects(k8s_api, "absent", True, []) == [""]
    custom: Any = client.CustomObjectsApi(k8s_api)
    body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "present"}}
    custom.create_namespaced_custom_object(
        "kopf.dev", "v1", namespace, "kopfpeerings", body, _preload_content=False
    )
    assert missing_peering_objects(k8s_api, "present", False, [namespace]) == []
    assert missing_peering_objects(k8s_api, "present", False, [namespace, "default"]) == ["default"]
