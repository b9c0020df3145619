"""The Triton pods behind a Service, from its EndpointSlices: pure functions, no I/O.

The operator watches EndpointSlices (a kopf index, ``slice_entries`` per slice) and, every tick,
turns the entries of a policy's Service into the endpoints its fleet switches
(``ready_endpoints``). discovery.k8s.io v1 and v1beta1 slices have the same fields used here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compass.dataplane.fleet import Endpoint

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class SliceEntry:
    """One address of one EndpointSlice: the pod, whether it is ready, its named ports."""

    pod: str
    address: str
    ready: bool
    ports: tuple[tuple[str, int], ...]


def slice_entries(body: Mapping[str, Any]) -> tuple[SliceEntry, ...]:
    """The addresses an EndpointSlice lists (the first address of each endpoint)."""
    ports = tuple(
        (str(port.get("name") or ""), int(port["port"]))
        for port in body.get("ports") or ()
        if port.get("port") is not None
    )
    entries = []
    for endpoint in body.get("endpoints") or ():
        addresses = endpoint.get("addresses") or ()
        if not addresses:
            continue
        conditions = endpoint.get("conditions") or {}
        # Kubernetes: "ready" unset means unknown, to be read as ready; a terminating pod is not.
        ready = conditions.get("ready") is not False and not conditions.get("terminating")
        target = endpoint.get("targetRef") or {}
        address = str(addresses[0])
        entries.append(SliceEntry(str(target.get("name") or address), address, ready, ports))
    return tuple(entries)


class PortError(ValueError):
    """A named port that the Service does not have."""


def _port(entry: SliceEntry, port: int | str) -> int:
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    named = dict(entry.ports)
    if port not in named:
        known = ", ".join(name or "(unnamed)" for name, _ in entry.ports) or "none"
        raise PortError(f"the Service has no port named {port!r} (its ports: {known})")
    return named[port]


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address  # IPv6


def ready_endpoints(
    slices: Iterable[Iterable[SliceEntry]],
    grpc_port: int | str,
    metrics_port: int | str | None,
) -> tuple[Endpoint, ...]:
    """The ready pods of a Service's slices, each once, in name order; PortError for a bad name."""
    found: dict[str, Endpoint] = {}
    for entries in slices:
        for entry in entries:
            if not entry.ready or entry.pod in found:
                continue
            host = _host(entry.address)
            metrics = (
                None
                if metrics_port is None
                else f"http://{host}:{_port(entry, metrics_port)}/metrics"
            )
            found[entry.pod] = Endpoint(entry.pod, f"{host}:{_port(entry, grpc_port)}", metrics)
    return tuple(found[name] for name in sorted(found))
