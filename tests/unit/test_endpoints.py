"""EndpointSlices -> the Triton pods a policy switches (compass.controllers.endpoints)."""

from __future__ import annotations

from typing import Any

import pytest

from compass.controllers.endpoints import PortError, ready_endpoints, slice_entries
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
