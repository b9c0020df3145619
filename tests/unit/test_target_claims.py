"""One actor per routing target: of the policies naming one Service (or one gRPC endpoint), the
oldest acts (creationTimestamp, then name); the others say which holds it and switch nothing."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from compass.api.paretopolicy_status import ConditionType
from compass.controllers import policy_conditions
from compass.controllers.claims import OldestClaims
from compass.controllers.endpoints import SliceEntry
from compass.controllers.policy_decisions import (
    Claim,
    claim_keys,
    claim_of,
    claimant,
    target_key,
)
from compass.controllers.targets import LOOPBACK, TargetAccess


def _policy(
    name: str, created: str, routing: dict[str, str], namespace: str = "a"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": {"routing": routing},
    }


def test_policies_on_one_service_share_a_target_and_other_services_do_not() -> None:
    one = target_key("a", {"routing": {"service": "triton"}})
    assert one == ("service", "a", "triton")
    assert one == target_key("a", {"routing": {"service": "triton", "grpcPort": 9}})
    assert one != target_key("b", {"routing": {"service": "triton"}})
    assert one != target_key("a", {"routing": {"service": "other"}})
    outside = {"routing": {"grpcEndpoint": "t.example.com:8001"}}
    assert target_key("a", outside, ANY_HOST) is not None
    assert target_key("a", outside) is None  # not in allowedHosts: refused, so no claim
    assert target_key("a", {}) is None


# Settings that let every namespace switch any other's routers, or reach any host.
ANY_NAMESPACE = TargetAccess(allowed_target_namespaces=("*",))
ANY_HOST = TargetAccess(allowed_hosts=("*",))


def _key(namespace: str, routing: dict[str, Any], access: TargetAccess = ANY_NAMESPACE) -> Any:
    return target_key(namespace, {"routing": routing}, access)


@pytest.mark.parametrize(
    "routing",
    [
        {"service": "triton"},
        {"service": "Triton", "grpcPort": 9000},
        {"grpcEndpoint": "triton:8001"},
        {"grpcEndpoint": "TRITON:08001"},
        {"grpcEndpoint": "triton:9000"},
        {"grpcEndpoint": "triton.ta.svc:8001"},
        {"grpcEndpoint": "triton.ta.svc.cluster.local:8001"},
        {"grpcEndpoint": "triton.ta.svc.cluster.local.:8001"},
        {"grpcEndpoint": "Triton.TA.SVC.:8001"},
    ],
)
def test_every_spelling_of_one_service_is_one_key(routing: dict[str, Any]) -> None:
    assert _key("ta", routing) == ("service", "ta", "triton")


def test_a_service_of_another_namespace_is_that_namespaces_key() -> None:
    # Named from tb, the Service in ta is the key ta's own policies hold.
    assert _key("tb", {"grpcEndpoint": "triton.ta.svc:8001"}) == ("service", "ta", "triton")
    assert _key("tb", {"service": "triton"}) == ("service", "tb", "triton")
    domain = TargetAccess(allowed_target_namespaces=("*",), cluster_domain="corp.internal")
    assert _key("tb", {"grpcEndpoint": "triton.ta.svc.corp.internal:1"}, domain) == (
        "service",
        "ta",
        "triton",
    )


@pytest.mark.parametrize(
    "endpoint",
    [
        "127.0.0.1:8001",
        "localhost:8001",
        "LOCALHOST.:8001",
        "[::1]:8001",
        "[0:0:0:0:0:0:0:1]:8001",
        "[::ffff:127.0.0.1]:8001",
        "127.1:8001",
        "2130706433:8001",
        "0x7f.0.0.1:8001",
        "127.0.0.2:08001",
        "0.0.0.0:8001",
        "[::]:8001",
    ],
)
def test_every_spelling_of_this_host_is_one_key(endpoint: str) -> None:
    # In any namespace: a tenant's policy and another's on one router hold one key.
    assert _key("ta", {"grpcEndpoint": endpoint}, ANY_HOST) == ("endpoint", LOOPBACK, "8001")
    assert _key("tb", {"grpcEndpoint": endpoint}, ANY_HOST) == ("endpoint", LOOPBACK, "8001")


def test_addresses_are_normalised_and_other_ports_or_hosts_are_other_keys() -> None:
    v6 = ("endpoint", "2001:db8::5", "8001")
    assert _key("a", {"grpcEndpoint": "[2001:DB8:0:0:0:0:0:5]:8001"}, ANY_HOST) == v6
    assert _key("a", {"grpcEndpoint": "[2001:db8::5]:8001"}, ANY_HOST) == v6
    v4 = ("endpoint", "10.0.0.5", "8001")
    assert _key("a", {"grpcEndpoint": "10.0.0.5:8001"}, ANY_HOST) == v4
    assert _key("b", {"grpcEndpoint": "[::ffff:10.0.0.5]:8001"}, ANY_HOST) == v4
    assert _key("a", {"grpcEndpoint": "10.0.0.5:8002"}, ANY_HOST) != v4
    assert _key("a", {"grpcEndpoint": "localhost:8002"}, ANY_HOST) != _key(
        "a", {"grpcEndpoint": "[::1]:1"}, ANY_HOST
    )
    # A host the settings list is that host, not a Service of the namespace.
    listed = TargetAccess(allowed_hosts=("triton-gw",))
    assert _key("a", {"grpcEndpoint": "triton-gw:8001"}, listed) == (
        "endpoint",
        "triton-gw",
        "8001",
    )
    assert _key("a", {"grpcEndpoint": "T.Example.com.:8001"}, ANY_HOST) == (
        "endpoint",
        "t.example.com",
        "8001",
    )


def test_a_target_the_settings_refuse_is_no_claim() -> None:
    """Refused (TargetNotAllowed), a policy switches nothing: it must not squat the router of a
    namespace it may not reach, nor a host it may not name, before that one's own policy."""
    own = TargetAccess()
    assert _key("tb", {"grpcEndpoint": "triton.ta.svc:8001"}, own) is None
    assert _key("tb", {"grpcEndpoint": "10.0.0.5:8001"}, own) is None
    assert _key("tb", {"grpcEndpoint": "127.0.0.1:8001"}, own) is None
    assert _key("tb", {"grpcEndpoint": "triton.tb.svc:8001"}, own) == ("service", "tb", "triton")
    assert _key("tb", {"grpcEndpoint": "triton:8001"}, own) == ("service", "tb", "triton")
    shared = TargetAccess(allowed_target_namespaces=("ta",))
    assert _key("tb", {"grpcEndpoint": "triton.ta.svc:8001"}, shared) == ("service", "ta", "triton")
    listed = TargetAccess(allowed_hosts=("127.0.0.1",))
    assert _key("tb", {"grpcEndpoint": "127.0.0.1:8001"}, listed) == ("endpoint", LOOPBACK, "8001")


def test_the_oldest_policy_acts_and_the_younger_is_told_which() -> None:
    old = claim_of(_policy("zeta", "2026-01-01T00:00:00Z", {"service": "triton"}))
    young = claim_of(_policy("alpha", "2026-01-02T00:00:00Z", {"service": "triton"}))
    assert old is not None
    assert young is not None
    claims = [old, young]
    assert claimant(claims, old) is None  # it acts
    assert claimant(claims, young) == old  # it holds back, naming zeta
    # The same instant: the name decides, the same way for both.
    twin = Claim("2026-01-01T00:00:00Z", "omega")
    assert claimant([old, twin], twin) is None
    assert claimant([old, twin], old) == twin
    # Alone: acts.
    assert claimant([young], young) is None
    # Another namespace's policy is named with its namespace; one's own, by name.
    other = claim_of(_policy("zeta", "2026-01-01T00:00:00Z", {"service": "t"}, namespace="b"))
    assert other is not None
    assert (other.shown("a"), other.shown("b")) == ("b/zeta", "zeta")


def test_a_policy_being_deleted_claims_nothing() -> None:
    body = _policy("zeta", "2026-01-01T00:00:00Z", {"service": "triton"})
    body["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    assert claim_of(body) is None


def test_the_younger_policy_is_not_ready_with_target_claimed_naming_the_other() -> None:
    health = policy_conditions.Health(claimed_by="zeta")
    ready = next(
        c
        for c in policy_conditions.health_conditions(health)
        if c.type == ConditionType.READY.value
    )
    assert (ready.status, ready.reason) == ("False", "TargetClaimed")
    assert "zeta" in ready.message


def _entry(pod: str, address: str, namespace: str = "ta") -> SliceEntry:
    return SliceEntry(pod, address, True, (("grpc", 8001), ("metrics", 8002)), "Pod", namespace)


def test_a_services_pods_are_the_service_and_a_forged_slice_aliases_nothing() -> None:
    """A policy on pod-ip:8001 and one on the Service whose slices list that Pod hold one
    router; a slice of another namespace that lists ta's Pod (a hand-made one) claims none."""
    slices = {
        ("ta", "triton"): [(_entry("t-0", "10.1.0.7"), _entry("t-1", "fd00::7"))],
        ("tb", "copy"): [(_entry("t-0", "10.1.0.7", namespace="ta"),)],
        ("tb", "mine"): [(_entry("m-0", "10.1.0.9", namespace="tb"),)],
    }
    pods = {("ta", "10.1.0.7"): {"t-0"}, ("ta", "fd00::7"): {"t-1"}, ("tb", "10.1.0.9"): {"m-0"}}

    def pods_at(namespace: str, ip: str) -> set[str]:
        return pods.get((namespace, ip), set())

    access = TargetAccess()
    service = ("service", "ta", "triton")
    pod = _key("tb", {"grpcEndpoint": "10.1.0.7:8001"}, ANY_HOST)
    assert pod == ("endpoint", "10.1.0.7", "8001")
    assert claim_keys(service, slices, pods_at, access) == {
        service,
        pod,
        ("endpoint", "10.1.0.7", "8002"),
        ("endpoint", "fd00::7", "8001"),
        ("endpoint", "fd00::7", "8002"),
    }
    assert claim_keys(pod, slices, pods_at, access) == {pod, service}
    v6 = _key("tb", {"grpcEndpoint": "[FD00:0::7]:8001"}, ANY_HOST)
    assert claim_keys(v6, slices, pods_at, access) == {v6, service}
    # Another port of no Service's, another address: their own key alone.
    other = ("endpoint", "10.1.0.7", "9999")
    assert claim_keys(other, slices, pods_at, access) == {other}
    assert claim_keys(("service", "tb", "copy"), slices, pods_at, access) == {
        ("service", "tb", "copy")
    }


class _Store:
    """A kopf index store as a tick reads it: the claims under one key; counts full reads."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], Claim] = {}
        self.scans = 0

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Claim]:
        self.scans += 1
        return iter(self.items.values())

    def __contains__(self, claim: object) -> bool:
        return claim in self.items.values()


def _claim(index: int) -> Claim:
    return Claim(f"2026-01-01T00:{index // 60:02d}:{index % 60:02d}Z", f"p{index}", "a")


def test_a_thousand_policies_on_one_router_read_the_oldest_claim_without_a_scan_each() -> None:
    oldest, store, key = OldestClaims(), _Store(), ("endpoint", "10.0.0.1", "8001")
    for index in range(1000):
        store.items[("a", f"p{index}")] = _claim(index)
        oldest.noted(("a", f"p{index}"), key, _claim(index))
    # Every policy's tick of a round: one scan in all, the same answer as comparing them all.
    assert {oldest.oldest(key, store) for _ in range(1000)} == {_claim(0)}
    assert store.scans == 1
    # Routine status writes call the index function with the same answer: still no scan.
    oldest.noted(("a", "p5"), key, _claim(5))
    assert oldest.oldest(key, store) == _claim(0)
    assert store.scans == 1
    # Deleted outright (kopf discards it without the index function): the next is the oldest.
    del store.items[("a", "p0")]
    assert oldest.oldest(key, store) == _claim(1)
    # Deleted and another added at once (the size unchanged): the add was noted.
    del store.items[("a", "p1")]
    store.items[("a", "early")] = Claim("2025-12-31T00:00:00Z", "early", "a")
    oldest.noted(("a", "early"), key, store.items[("a", "early")])
    assert oldest.oldest(key, store) == store.items[("a", "early")]


def test_deleted_policies_leave_nothing_behind_in_the_cache() -> None:
    oldest, key = OldestClaims(), ("service", "ns", "triton")
    for index in range(1000):
        oldest.noted(("a", f"p{index}"), key, _claim(index))
    for index in range(1000):
        oldest.forget(("a", f"p{index}"))
    assert len(oldest) == 0


@pytest.mark.parametrize("seed", range(5))
def test_the_cached_oldest_claim_is_always_the_oldest_of_the_store(seed: int) -> None:
    rng, oldest = random.Random(seed), OldestClaims()
    stores = {key: _Store() for key in ("k1", "k2")}
    for _ in range(2000):
        who = ("a", f"p{rng.randrange(30)}")
        for store in stores.values():
            store.items.pop(who, None)
        action = rng.random()
        if action < 0.6:
            # Added or moved (the index function answers): a new claim under a key.
            key, claim = rng.choice(list(stores)), _claim(rng.randrange(600))
            stores[key].items[who] = claim
            oldest.noted(who, key, claim)
        elif action < 0.8:
            oldest.noted(who, None, None)  # being deleted: the index function answers nothing
        else:
            oldest.forget(who)  # deleted: the watch's DELETED event, not the index function
        for key, store in stores.items():
            assert oldest.oldest(key, store) == min(store.items.values(), default=None)
