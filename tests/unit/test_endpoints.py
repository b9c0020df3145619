"""EndpointSlices -> the Triton pods a policy switches (compass.controllers.endpoints)."""

from __future__ import annotations

from typing import Any

import pytest

from compass.controllers.endpoints import (
    PortError,
    admitted,
    pod_addresses,
    ready_endpoints,
    slice_entries,
)
from compass.controllers.targets import TargetAccess
from compass.dataplane.fleet import Endpoint


def endpoint_slice(*pods: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """An EndpointSlice as the API returns it, with ports grpc 8001 and metrics 8002."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"labels": {"kubernetes.io/service-name": "triton"}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": 8001}, {"name": "metrics", "port": 8002}],
        "endpoints": [
            {"addresses": [address], "conditions": conditions, "targetRef": {"name": pod}}
            for pod, address, conditions in pods
        ],
    }


def test_ready_pods_become_endpoints_on_their_named_ports() -> None:
    first = slice_entries(
        endpoint_slice(
            ("triton-b", "10.0.0.2", {"ready": True}),
            ("triton-old", "10.0.0.9", {"ready": False, "terminating": True}),
        )
    )
    second = slice_entries(endpoint_slice(("triton-a", "10.0.0.1", {})))  # unset: ready
    assert ready_endpoints([first, second], "grpc", "metrics") == (
        Endpoint("triton-a", "10.0.0.1:8001", "http://10.0.0.1:8002/metrics"),
        Endpoint("triton-b", "10.0.0.2:8001", "http://10.0.0.2:8002/metrics"),
    )


def test_a_terminating_pod_is_left_out_even_if_still_ready() -> None:
    entries = slice_entries(endpoint_slice(("a", "10.0.0.1", {"ready": True, "terminating": True})))
    assert ready_endpoints([entries], 8001, None) == ()


def test_numbers_need_no_port_names_and_ipv6_is_bracketed() -> None:
    entries = slice_entries(endpoint_slice(("a", "fd00::1", {"ready": True})))
    assert ready_endpoints([entries], 9001, "9002") == (
        Endpoint("a", "[fd00::1]:9001", "http://[fd00::1]:9002/metrics"),
    )


def test_a_pod_in_two_slices_is_switched_once() -> None:
    entries = slice_entries(endpoint_slice(("a", "10.0.0.1", {"ready": True})))
    assert len(ready_endpoints([entries, entries], "grpc", None)) == 1


def test_a_port_name_the_service_lacks_is_named_with_the_ports_it_has() -> None:
    entries = slice_entries(endpoint_slice(("a", "10.0.0.1", {"ready": True})))
    with pytest.raises(PortError, match=r"no port named 'rpc' \(its ports: grpc, metrics\)"):
        ready_endpoints([entries], "rpc", None)


def test_an_empty_slice_has_no_entries() -> None:
    assert slice_entries({"endpoints": None, "ports": None}) == ()


# ---------------------------------------------------------------------------- whose address


def _slice(*endpoints: dict[str, Any]) -> dict[str, Any]:
    """An EndpointSlice of Service triton with these endpoints, as the kopf index holds it."""
    return {
        "metadata": {"namespace": "tenant-a", "labels": {"kubernetes.io/service-name": "triton"}},
        "ports": [{"name": "grpc", "port": 8001}, {"name": "metrics", "port": 8002}],
        "endpoints": list(endpoints),
    }


def _endpoint(address: str, ref: dict[str, str] | None) -> dict[str, Any]:
    return {"addresses": [address], "conditions": {"ready": True}} | (
        {"targetRef": ref} if ref is not None else {}
    )


# The Pod index of namespace tenant-a: its pods' own IPs (tenant B's pod is 10.0.9.9).
TENANT_A_PODS = {"10.0.0.1": {"triton-a"}}


def _vet(
    *endpoints: dict[str, Any], access: TargetAccess | None = None
) -> tuple[tuple[Endpoint, ...], tuple[str, ...]]:
    entries, refused = admitted(
        [slice_entries(_slice(*endpoints))],
        "tenant-a",
        lambda ip: TENANT_A_PODS.get(ip, set()),
        access or TargetAccess(),
    )
    return ready_endpoints([entries], "grpc", "metrics"), refused


def test_a_pod_of_the_policys_namespace_at_its_own_ip_is_switched() -> None:
    ref = {"kind": "Pod", "name": "triton-a", "namespace": "tenant-a"}
    found, refused = _vet(_endpoint("10.0.0.1", ref))
    assert [e.name for e in found] == ["triton-a"]
    assert refused == ()


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        # A selector-less Service with a hand-made slice: no targetRef at all.
        (None, "not a Pod (targetRef kind unset)"),
        ({"kind": "Node", "name": "node-1"}, "not a Pod (targetRef kind Node)"),
        # The targetRef names tenant B's pod honestly: another namespace.
        (
            {"kind": "Pod", "name": "triton-b", "namespace": "tenant-b"},
            "a Pod of namespace tenant-b",
        ),
        # It lies: a Pod of its own namespace, at B's IP, which no Pod of tenant-a holds.
        (
            {"kind": "Pod", "name": "triton-a", "namespace": "tenant-a"},
            "no Pod's, not Pod triton-a",
        ),
        ({"kind": "Pod", "name": "triton-b"}, "no Pod's, not Pod triton-b"),
    ],
)
def test_another_namespaces_pod_ip_in_a_hand_made_slice_is_neither_switched_nor_scraped(
    ref: dict[str, str] | None, why: str
) -> None:
    found, refused = _vet(_endpoint("10.0.9.9", ref))
    assert found == ()
    [reason] = refused
    assert reason.startswith("10.0.9.9 ")
    assert why in reason


def test_a_slice_address_claiming_a_pod_of_the_namespace_at_anothers_ip_is_refused() -> None:
    """triton-a is real, but 10.0.0.1 is its IP, not the slice's 10.0.9.9."""
    good = _endpoint("10.0.0.1", {"kind": "Pod", "name": "triton-a"})
    forged = _endpoint("10.0.9.9", {"kind": "Pod", "name": "triton-a"})
    found, refused = _vet(good, forged)
    assert found == (Endpoint("triton-a", "10.0.0.1:8001", "http://10.0.0.1:8002/metrics"),)
    assert len(refused) == 1


def test_an_address_the_operators_allowed_hosts_lists_is_switched() -> None:
    found, refused = _vet(_endpoint("192.0.2.7", None), access=TargetAccess(("192.0.2.7",)))
    assert [e.grpc_url for e in found] == ["192.0.2.7:8001"]
    assert refused == ()


def test_a_pod_index_holds_a_pods_own_ips_never_a_host_network_pods() -> None:
    pod = {"status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}}
    assert pod_addresses(pod) == ["10.0.0.1", "fd00::1"]
    assert pod_addresses({"status": {"podIP": "10.0.0.2"}}) == ["10.0.0.2"]
    assert pod_addresses({"spec": {"hostNetwork": True}, "status": {"podIP": "192.168.1.5"}}) == []
    assert pod_addresses({"status": {}}) == []
