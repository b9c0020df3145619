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


def cel_matches_url(expression: str) -> str:
    """CEL that holds when the string ``expression`` has the allowed shape (URL_PATTERN)."""
    # A CEL string literal reads a backslash as an escape: double it.
    return f"{expression}.matches('{URL_PATTERN.replace(chr(92), chr(92) * 2)}')"


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
