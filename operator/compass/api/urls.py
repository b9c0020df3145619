"""The shape of a URL a resource names: http or https, a host, a path, nothing else.

The operator appends to these URLs (Prometheus' /api/v1/query) and fetches them itself, so a
scheme other than http(s) (file://), credentials (visible to anyone who reads the resource) or
a query or fragment (which would swallow the appended path) are refused. Which hosts may be
reached is the operator's decision (compass.controllers.targets), not the resource's.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# The longest URL a resource may give (the CRD's maxLength too).
MAX_URL_LENGTH = 2048
# The one pattern both sides check: pydantic here, the API server through the CRD's CEL rule.
URL_PATTERN = r"^https?://[^/?#@\s:][^/?#@\s]*(/[^?#\s]*)?$"
_URL = re.compile(URL_PATTERN)


def cel_matches(expression: str, pattern: str) -> str:
    """CEL that holds when the string ``expression`` matches ``pattern`` (a regular expression)."""
    # A CEL string literal reads a backslash as an escape: double it.
    return f"{expression}.matches('{pattern.replace(chr(92), chr(92) * 2)}')"


def url_problem(url: str) -> str | None:
    """What is wrong with a resource's URL, and the fix; None if it has the allowed shape."""
    if _URL.fullmatch(url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{url!r} is not a URL; write it as http://host:port/path"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or 'missing'!r}: only http:// or https:// URLs are read"
    if "@" in parts.netloc:
        return (
            "has credentials (user@host), which anyone who reads the resource could read; "
            "remove them, and put credentials in a Secret (metrics.authentication)"
        )
    if "?" in url:
        return (
            "has a query (?...), which would swallow the path the operator appends; give the "
            "base URL alone (PromQL goes in metrics.query)"
        )
    if "#" in url:
        return "has a fragment (#...); remove it"
    return f"{url!r} is not http(s)://host[:port][/path] (no spaces, a host is required)"


# A gRPC endpoint, host:port: a DNS name or IPv4 address, or an IPv6 one in brackets, and a
# port in 1-65535 (the regular expression spells the range: the API server checks it too).
_PORT_RANGE = (
    r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
)
ENDPOINT_PATTERN = rf"^([A-Za-z0-9]([-A-Za-z0-9._]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):{_PORT_RANGE}$"
_ENDPOINT = re.compile(ENDPOINT_PATTERN)
MAX_PORT = 65535


def endpoint_problem(address: str) -> str | None:
    """What is wrong with a host:port endpoint (no fix: ENDPOINT_FIX); None if it is one."""
    if _ENDPOINT.fullmatch(address):
        return None
    host, colon, port = address.rpartition(":")
    if not colon or not host:
        return f"{address!r:.80} is not host:port"
    if not port.isascii() or not port.isdigit():
        return f"port {port!r:.20} is not a number"
    if not 1 <= int(port) <= MAX_PORT:  # gRPC takes it modulo 65536: 99999999 would dial 57599
        shown = port if len(port) <= 20 else f"{port[:20]}..."
        return f"port {shown} is outside 1-{MAX_PORT}"
    return f"host {host!r:.80} is not a DNS name, an IPv4 address or [an IPv6 address]"


ENDPOINT_FIX = "write host:port with a port in 1-65535, e.g. triton.example.com:8001"
