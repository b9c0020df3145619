"""Credentials, headers and TLS trust for a metrics endpoint, from a Secret (never in a repr or
a message: a wrong CA or key is named by its part, never its content)."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path


class TlsMaterialError(ValueError):
    """A CA or client certificate/key that ssl cannot load; ``part`` is ca, cert or key."""

    def __init__(self, part: str, what: str) -> None:
        super().__init__(f"{part}: {what}")
        self.part, self.what = part, what


@dataclass(frozen=True)
class HttpAuth:
    """A bearer token or basic auth, extra headers, and whom https trusts (None: system roots)."""

    bearer_token: str | None = field(default=None, repr=False)
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    ca_pem: str | None = field(default=None, repr=False)
    client_cert_pem: str | None = field(default=None, repr=False)
    client_key_pem: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = ()
    insecure_skip_verify: bool = False

    def request_headers(self) -> dict[str, str]:
        """The headers every request carries: the spec's, then Authorization."""
        headers = dict(self.headers)
        if self.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        elif self.username is not None:
            pair = f"{self.username}:{self.password or ''}".encode()
            headers["Authorization"] = f"Basic {base64.b64encode(pair).decode('ascii')}"
        return headers

    @cached_property
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for https, built once; TlsMaterialError naming a bad part."""
        if self.ca_pem is not None and not self.insecure_skip_verify:
            try:
                context = ssl.create_default_context(cadata=self.ca_pem)
            except (ssl.SSLError, ValueError) as error:
                raise TlsMaterialError("ca", "not a PEM certificate ssl can load") from error
        else:
            context = ssl.create_default_context()
        if self.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem is not None and self.client_key_pem is not None:
            _load_client_pair(context, self.client_cert_pem, self.client_key_pem)
        return context


def _load_client_pair(context: ssl.SSLContext, cert_pem: str, key_pem: str) -> None:
    """Load a client pair (ssl reads files only: a private temporary directory, /tmp in memory)."""
    try:
        with tempfile.TemporaryDirectory(prefix="compass-tls-") as directory:
            cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            for path, text in ((cert, cert_pem), (key, key_pem)):
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                    out.write(text)
            try:
                context.load_cert_chain(cert, key)
            except (ssl.SSLError, ValueError) as error:
                raise TlsMaterialError(
                    "cert", "the client certificate and key are not a matching PEM pair"
                ) from error
    except OSError as error:  # no room or no writable /tmp: not the pair's fault, but no pair
        raise TlsMaterialError(
            "cert", f"the pair could not be written to a temporary file ({error.strerror})"
        ) from error
