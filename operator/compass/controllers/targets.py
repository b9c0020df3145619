"""Which hosts and namespaces a resource may point the operator at (docs/operations.md)."""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from compass.api.meta import DNS_LABEL_PATTERN
from compass.domain.errors import FieldError

ANY = "*"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
_LABEL = re.compile(DNS_LABEL_PATTERN)


class TargetRefusedError(FieldError):
    """The operator's settings do not let a resource reach this target: field, what, fix."""


@dataclass(frozen=True)
class TargetAccess:
    """The operator's settings on what resources may reach (empty: in-cluster Services only)."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_target_namespaces: tuple[str, ...] = ()
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    metrics_namespaces: tuple[str, ...] = ()

    def host_named(self, host: str) -> bool:
        """Whether the settings list this very host (no wildcard)."""
        host = host.lower().rstrip(".").strip("[]")
        return host in (entry.lower().rstrip(".").strip("[]") for entry in self.allowed_hosts)

    def host_listed(self, host: str) -> bool:
        """Whether the settings list this host: exactly, under a ``*.`` domain, or ``*``."""
        host = host.lower().rstrip(".").strip("[]")
        for allowed in (entry.lower().rstrip(".").strip("[]") for entry in self.allowed_hosts):
            if allowed in (ANY, host):
                return True
            if allowed.startswith("*.") and host.endswith(allowed[1:]):
                return True
        return False

    def namespace_allowed(self, target: str, own: str) -> bool:
        """Whether a resource in namespace ``own`` may switch a router in ``target``."""
        allowed = self.allowed_target_namespaces
        return target == own or ANY in allowed or target in allowed

    def metrics_namespace_allowed(self, target: str, own: str) -> bool:
        """Whether a resource in ``own`` may read metrics in ``target`` (own, routers', listed)."""
        listed = self.metrics_namespaces
        return self.namespace_allowed(target, own) or ANY in listed or target in listed


def service_namespace(host: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> str | None:
    """The namespace of an in-cluster Service name (NAME.NAMESPACE.svc[.domain]), or None."""
    labels = host.lower().rstrip(".").split(".")
    for suffix in (["svc"], ["svc", *cluster_domain.lower().split(".")]):
        if (
            len(labels) == 2 + len(suffix)
            and labels[2:] == suffix
            and all(_LABEL.match(label) for label in labels[:2])
        ):
            return labels[1]
    return None


def _refused_host(field: str, host: str) -> TargetRefusedError:
    return TargetRefusedError(
        field,
        f"host {host!r} is not an in-cluster Service name and the operator's settings do not "
        "allow it",
        "name a Service (NAME for one in this namespace, or NAME.NAMESPACE.svc), or ask the "
        "operator's administrator to add the host to allowedHosts (Helm value)",
    )


def resolve_host(
    host: str, field: str, namespace: str, access: TargetAccess, *, router: bool = False
) -> str:
    """The host to reach for a resource in ``namespace``; ``router``: its namespace allowed too."""
    in_namespace = service_namespace(host, access.cluster_domain)
    if in_namespace is not None:
        if router and not access.namespace_allowed(in_namespace, namespace):
            raise TargetRefusedError(
                field,
                f"{host} is a Service in namespace {in_namespace}, and a resource may only "
                f"switch routers in its own ({namespace})",
                "point it at a Service of this namespace, or ask the operator's administrator "
                f"to add {in_namespace} to allowedTargetNamespaces (Helm value)",
            )
        return host
    if access.host_listed(host):
        return host
    if _LABEL.match(host.lower()):
        return f"{host.lower()}.{namespace}.svc"
    raise _refused_host(field, host)


def resolve_url(url: str, field: str, namespace: str, access: TargetAccess) -> str:
    """The URL to read for a resource in ``namespace`` (a bare Service name qualified); another
    namespace's Service only where opened to metrics reads (no reading another tenant's)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    resolved = resolve_host(host, field, namespace, access) if host else None
    if resolved is None:
        raise _refused_host(field, host)
    in_namespace = service_namespace(resolved, access.cluster_domain)
    if (
        in_namespace is not None
        and not access.metrics_namespace_allowed(in_namespace, namespace)
        and not access.host_named(host)
    ):
        raise TargetRefusedError(
            field,
            f"{host} is a Service in namespace {in_namespace}, and a resource may only read "
            f"metrics in its own ({namespace})",
            "read a Service of this namespace, or ask the operator's administrator to add "
            f"{in_namespace} to metricsNamespaces (Helm value)",
        )
    if resolved == host:
        return url
    netloc = resolved if parts.port is None else f"{resolved}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


# ---------------------------------------------------------------------------- one key a router

# Every spelling of this host (127.0.0.0/8, ::1, localhost, 0.0.0.0, ::) reaches the same
# process: one key.
LOOPBACK = "loopback"
_NUMERIC_IPV4 = re.compile(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}")


def _address(host: str) -> str | None:
    """The address an IP literal reaches, in one spelling (loopback: LOOPBACK); None for a name."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        if not _NUMERIC_IPV4.fullmatch(host):
            return None
        try:  # 127.1, 2130706433, 0x7f.1: what the resolver's inet_aton reads them as
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return LOOPBACK
    return str(ip)


def endpoint_target(
    endpoint: str, namespace: str, access: TargetAccess = TargetAccess()
) -> tuple[str, str, str]:
    """The router a host:port reaches whatever its spelling: ("service", NAMESPACE, NAME) for a
    Service (any port), else ("endpoint", address or host, port)."""
    host, _, port_text = endpoint.rpartition(":")
    host = host.strip().strip("[]").lower().rstrip(".")
    port = str(int(port_text)) if port_text.strip().isdigit() else port_text.strip()
    address = _address(host)
    if address is None and (host == "localhost" or host.endswith(".localhost")):
        address = LOOPBACK
    if address is not None:
        return ("endpoint", address, port)
    in_namespace = service_namespace(host, access.cluster_domain)
    if in_namespace is not None:
        return ("service", in_namespace, host.split(".", 1)[0])
    if _LABEL.match(host) and not access.host_listed(host):
        return ("service", namespace, host)
    return ("endpoint", host, port)
