"""The Triton pods behind a Service, from its EndpointSlices; only ``admitted`` entries count."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compass.controllers.targets import TargetAccess
from compass.dataplane.fleet import Endpoint

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class SliceEntry:
    """One address of one EndpointSlice: the pod, whether it is ready, its named ports."""

    pod: str
    address: str
    ready: bool
    ports: tuple[tuple[str, int], ...]
    # The endpoint's targetRef: its kind (Pod for a Service's pods) and namespace ("" unset).
    kind: str = ""
    namespace: str = ""

    @property
    def host(self) -> str:
        """The address as a URL's host (an IPv6 one in brackets)."""
        return f"[{self.address}]" if ":" in self.address else self.address


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
        entries.append(
            SliceEntry(
                str(target.get("name") or address),
                address,
                ready,
                ports,
                str(target.get("kind") or ""),
                str(target.get("namespace") or ""),
            )
        )
    return tuple(entries)


def pod_addresses(body: Mapping[str, Any]) -> list[str]:
    """The IPs a Pod holds for itself (none for a host-network pod: the node's is no pod's)."""
    if (body.get("spec") or {}).get("hostNetwork"):
        return []
    status = body.get("status") or {}
    listed = [str(ip["ip"]) for ip in status.get("podIPs") or () if ip.get("ip")]
    return listed or ([str(status["podIP"])] if status.get("podIP") else [])


def admitted(
    slices: Iterable[Iterable[SliceEntry]],
    namespace: str,
    pods_at: Callable[[str], Collection[str]],
    access: TargetAccess,
) -> tuple[tuple[SliceEntry, ...], tuple[str, ...]]:
    """The entries a policy in ``namespace`` may switch and scrape, and why each refused one was."""
    kept: list[SliceEntry] = []
    refused: list[str] = []
    for entries in slices:
        for entry in entries:
            why = _refusal(entry, namespace, pods_at, access)
            if why is None:
                kept.append(entry)
            elif entry.ready:
                refused.append(f"{entry.address} ({entry.pod}): {why}")
    return tuple(kept), tuple(sorted(set(refused)))


def _refusal(
    entry: SliceEntry,
    namespace: str,
    pods_at: Callable[[str], Collection[str]],
    access: TargetAccess,
) -> str | None:
    if access.host_listed(entry.address):
        return None
    if entry.kind != "Pod":
        return f"not a Pod (targetRef kind {entry.kind or 'unset'}) and not in allowedHosts"
    if entry.namespace not in ("", namespace):
        return f"a Pod of namespace {entry.namespace}, not {namespace}"
    holders = pods_at(entry.address)
    if entry.pod not in holders:
        held = f"Pod {', '.join(sorted(holders))}'s" if holders else "no Pod's"
        return f"in namespace {namespace} this address is {held}, not Pod {entry.pod}'s"
    return None


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
            metrics = (
                None
                if metrics_port is None
                else f"http://{entry.host}:{_port(entry, metrics_port)}/metrics"
            )
            found[entry.pod] = Endpoint(
                entry.pod, f"{entry.host}:{_port(entry, grpc_port)}", metrics
            )
    return tuple(found[name] for name in sorted(found))
