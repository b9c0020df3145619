"""Pure decisions on a policy's metrics credentials: what the Secret must hold, when to re-read."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from compass.api.metricsource import MetricsAuthentication, TritonTls
from compass.dataplane.httpauth import HttpAuth, TlsMaterialError
from compass.dataplane.triton import GrpcTls

# A Secret that was read is checked again this often (its resourceVersion: the client is rebuilt
# only when it changed).
SECRET_RECHECK_S = 60.0
# A Secret (or key) that was missing, or credentials the endpoint refused (401, 403), are read
# again this often: a policy recovers within seconds of the fix.
SECRET_RETRY_S = 5.0
# The condition's reason while the credentials cannot be read.
REASON = "MetricsCredentialsUnavailable"
# The label a Secret must carry before its values are sent anywhere: else whoever may write a
# policy could have any Secret of the namespace (a token) sent to a metrics URL of their own.
CONSENT_LABEL = "compass.io/metrics-credentials"


class CredentialsError(ValueError):
    """The credentials cannot be had: one line naming the Secret, the key's field and the fix."""


def secret_name(auth: MetricsAuthentication | None) -> str | None:
    """The Secret a policy's authentication reads, or None if it reads none."""
    if auth is None or auth.secret_ref is None:
        return None
    return auth.secret_ref.name


def recheck_due(read_at: float | None, now: float, *, available: bool, rejected: bool) -> bool:
    """Whether to read the Secret again: never read, or SECRET_RECHECK_S (unavailable or refused:
    SECRET_RETRY_S) passed."""
    if read_at is None:
        return True
    return now - read_at >= (SECRET_RECHECK_S if available and not rejected else SECRET_RETRY_S)


def resource_version(secret: Mapping[str, Any] | None) -> str | None:
    """The Secret's resourceVersion (None: missing)."""
    if secret is None:
        return None
    return str((secret.get("metadata") or {}).get("resourceVersion") or "") or None


def credentials(
    auth: MetricsAuthentication, secret: Mapping[str, Any] | None, namespace: str
) -> HttpAuth:
    """The HttpAuth of a policy's authentication with this Secret (its JSON; None: not found)."""
    headers = tuple((h.name, h.value) for h in auth.headers)
    tls = auth.tls
    insecure = tls is not None and tls.insecure_skip_verify
    name = secret_name(auth)
    if name is None:
        return HttpAuth(headers=headers, insecure_skip_verify=insecure)
    field = "spec.metrics.authentication"
    read = _SecretReader(secret, namespace, name, field, _wanted_keys(auth), "metrics endpoint")
    token = username = password = None
    if auth.bearer is not None:
        token = read.value(auth.bearer.token_key, "bearer.tokenKey")
    elif auth.basic is not None:
        username = read.value(auth.basic.username_key, "basic.usernameKey")
        password = read.value(auth.basic.password_key, "basic.passwordKey")
    ca = cert = key = None
    if tls is not None:
        if not tls.insecure_skip_verify:
            ca = read.value(tls.ca_key, "tls.caKey", text=False)
        if tls.cert_key is not None and tls.key_key is not None:
            cert = read.value(tls.cert_key, "tls.certKey", text=False)
            key = read.value(tls.key_key, "tls.keyKey", text=False)
    result = HttpAuth(
        bearer_token=token,
        username=username,
        password=password,
        ca_pem=ca,
        client_cert_pem=cert,
        client_key_pem=key,
        headers=headers,
        insecure_skip_verify=insecure,
    )
    try:
        _ = result.ssl_context  # load the CA and client pair now, to name the key that is wrong
    except TlsMaterialError as error:
        part = "tls.caKey" if error.part == "ca" else "tls.certKey and tls.keyKey"
        raise CredentialsError(
            f"{read.where}: {part} ({field}.{part}): {error.what}; store the "
            "PEM text (-----BEGIN CERTIFICATE-----...)"
        ) from None
    return result


def triton_tls(
    tls: TritonTls,
    secret: Mapping[str, Any] | None,
    namespace: str,
    field: str,
    owner: str = "policy",
) -> GrpcTls:
    """The GrpcTls a resource's TLS to Triton gets from this Secret, by the credentials' rules."""
    wanted = [k for k in (tls.ca_key, tls.cert_key, tls.key_key) if k is not None]
    read = _SecretReader(
        secret, namespace, tls.secret_ref.name, field, wanted, "Triton's gRPC port", owner
    )
    pems = {"caKey": read.value(tls.ca_key, "caKey", text=False)}
    if tls.cert_key is not None and tls.key_key is not None:
        pems["certKey"] = read.value(tls.cert_key, "certKey", text=False)
        pems["keyKey"] = read.value(tls.key_key, "keyKey", text=False)
    for part, pem in pems.items():
        if "-----BEGIN " not in pem:
            raise CredentialsError(
                f"{read.where}: {part} ({field}.{part}) is not PEM (no -----BEGIN line); store "
                "the PEM text"
            )
    return GrpcTls(
        ca_pem=pems["caKey"].encode(),
        cert_pem=pems["certKey"].encode() if "certKey" in pems else None,
        key_pem=pems["keyKey"].encode() if "keyKey" in pems else None,
        server_name=tls.server_name,
    )


class _SecretReader:
    """A Secret's values as the consent rules allow (found, labelled, keys present, UTF-8)."""

    def __init__(
        self,
        secret: Mapping[str, Any] | None,
        namespace: str,
        name: str,
        field: str,
        wanted: list[str],
        purpose: str,
        owner: str = "policy",
    ) -> None:
        self.field = field
        self.where = f"Secret {namespace}/{name} ({field}.secretRef)"
        if secret is None:
            raise CredentialsError(
                f"{self.where} not found; create it in the {owner}'s namespace with the keys "
                f"{', '.join(wanted)}, or correct secretRef.name"
            )
        labels = (secret.get("metadata") or {}).get("labels") or {}
        if labels.get(CONSENT_LABEL) != "true":
            raise CredentialsError(
                f"{self.where} is not labelled {CONSENT_LABEL}=true, so it is never sent: label "
                f"it (kubectl label secret {name} -n {namespace} {CONSENT_LABEL}=true) if its "
                f"values are meant for this {purpose}"
            )
        self.data: Mapping[str, str] = secret.get("data") or {}

    def value(self, key: str, field: str, *, text: bool = True) -> str:
        """The key's value (``field``: the resource's field that names the key)."""
        where, named = self.where, f"{self.field}.{field}"
        encoded = self.data.get(key)
        if not encoded:
            raise CredentialsError(
                f"{where} has no key {key!r} ({named}); add it to the Secret, or name the key "
                f"that holds it in {field}"
            )
        try:
            decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise CredentialsError(
                f"{where}: key {key!r} ({named}) is not UTF-8 text; store it as text"
            ) from None
        if not text:
            return decoded
        # A value written with echo ends in a newline; one inside would smuggle a header in,
        # and a header is Latin-1 on the wire: printable ASCII only, as the spec's headers.
        decoded = decoded.strip()
        if not decoded or not all(" " <= c < "\x7f" for c in decoded):
            raise CredentialsError(
                f"{where}: key {key!r} ({named}) is empty or holds a control character (a line "
                "break?) or a character outside printable ASCII; store the value alone"
            )
        return decoded


def _wanted_keys(auth: MetricsAuthentication) -> list[str]:
    """The keys the Secret must hold, for the message."""
    keys = []
    if auth.bearer is not None:
        keys.append(auth.bearer.token_key)
    if auth.basic is not None:
        keys += [auth.basic.username_key, auth.basic.password_key]
    if auth.tls is not None:
        if not auth.tls.insecure_skip_verify:
            keys.append(auth.tls.ca_key)
        keys += [k for k in (auth.tls.cert_key, auth.tls.key_key) if k is not None]
    return keys
