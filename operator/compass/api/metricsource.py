"""Where a ParetoPolicy reads its queue depth: the metrics source, its authentication and TLS;
and TLS to Triton's gRPC port (TritonTls), under the same Secret rules.

Credentials and CA come from a Secret of the resource's namespace; extra headers are plain
values in the resource, so the ones that carry credentials or framing are refused.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from compass.api.meta import (
    MAX_NAME_LENGTH,
    MAX_QUERY_LENGTH,
    CamelModel,
    DnsSubdomain,
)
from compass.api.rules import CelRule, cel_rules
from compass.api.urls import MAX_URL_LENGTH, URL_PATTERN, cel_matches, url_problem


class MetricsSourceType(StrEnum):
    """Where the queue depth comes from."""

    PROMETHEUS = "prometheus"
    TRITON = "triton"
    # A model server's own /metrics (vLLM's vllm:num_requests_waiting, summed over its models).
    VLLM = "vllm"


# A Secret's data key (Kubernetes' own rule for them).
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# Extra request headers: a few short ones (a tenant ID, an API version), never a credential.
MAX_HEADERS = 16
MAX_HEADER_NAME_LENGTH = 128
MAX_HEADER_VALUE_LENGTH = 1024
# An HTTP token (RFC 9110); a value is printable ASCII and spaces: no line break to smuggle
# another header in.
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
HEADER_VALUE_PATTERN = r"^[ -~]*$"
# Headers the operator sets itself or that would change how the request is framed or routed;
# Authorization in a resource would be a credential anyone who reads it can read.
RESERVED_HEADERS = (
    "authorization",
    "proxy-authorization",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
)
_RESERVED_HEADER_RE = f"(?i)^({'|'.join(RESERVED_HEADERS)})$"
# Mutual TLS: a client certificate comes with its key (the same rule for pydantic and CEL).
_CLIENT_PAIR = "give both tls.certKey and tls.keyKey (mutual TLS), or neither"
_CLIENT_PAIR_RULE = CelRule(rule="has(self.certKey) == has(self.keyKey)", message=_CLIENT_PAIR)


def _secret_key(default: str | None, what: str) -> Any:
    """A field naming a key of the Secret."""
    return Field(
        default=default,
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=SECRET_KEY_PATTERN,
        description=f"The Secret's key that holds {what}.",
    )


class SecretReference(CamelModel):
    """A Secret in the policy's own namespace."""

    name: DnsSubdomain = Field(
        min_length=1, description="The Secret's name; it must be in the policy's namespace."
    )


class BearerAuthentication(CamelModel):
    """A bearer token from the Secret, sent as ``Authorization: Bearer <token>``."""

    token_key: str = _secret_key("token", "the token")


class BasicAuthentication(CamelModel):
    """HTTP basic auth with a user name and password from the Secret."""

    username_key: str = _secret_key("username", "the user name")
    password_key: str = _secret_key("password", "the password")


class MetricsTls(CamelModel):
    """Whom to trust over https, and an optional client certificate (mutual TLS)."""

    model_config = cel_rules(_CLIENT_PAIR_RULE)

    ca_key: str = _secret_key(
        "ca.crt", "the PEM CA bundle the server's certificate is verified against"
    )
    cert_key: str | None = _secret_key(None, "the PEM client certificate (mutual TLS)")
    key_key: str | None = _secret_key(None, "the PEM client private key (mutual TLS)")
    insecure_skip_verify: bool = Field(
        default=False,
        description="Do not verify the server's certificate at all (caKey is then not read). "
        "Anyone on the path can then read the credentials: for a test cluster only.",
    )

    @model_validator(mode="after")
    def _pair(self) -> MetricsTls:
        if (self.cert_key is None) != (self.key_key is None):
            raise ValueError(_CLIENT_PAIR)
        return self


class TritonTls(CamelModel):
    """TLS to the Triton pods' gRPC port (Triton's --grpc-use-ssl): the CA bundle, and for mutual
    TLS a client certificate and key, from a Secret of the resource's namespace labelled
    compass.io/metrics-credentials=true."""

    model_config = cel_rules(_CLIENT_PAIR_RULE)

    secret_ref: SecretReference = Field(
        description="The Secret with the CA (and the client pair); it must carry the label "
        "compass.io/metrics-credentials=true."
    )
    ca_key: str = _secret_key(
        "ca.crt", "the PEM CA bundle Triton's certificate is verified against"
    )
    cert_key: str | None = _secret_key(None, "the PEM client certificate (mutual TLS)")
    key_key: str | None = _secret_key(None, "the PEM client private key (mutual TLS)")
    server_name: DnsSubdomain | None = Field(
        default=None,
        description="The name Triton's certificate carries, where it is not the address dialled "
        "(pods are dialled by IP: give the Service's DNS name its certificate names).",
    )

    @model_validator(mode="after")
    def _pair(self) -> TritonTls:
        if (self.cert_key is None) != (self.key_key is None):
            raise ValueError(_CLIENT_PAIR)
        return self


class HttpHeader(CamelModel):
    """One extra request header; its value is not secret (it is in the resource)."""

    model_config = cel_rules(
        CelRule(
            rule=f"!self.name.matches('{_RESERVED_HEADER_RE}')",
            message="this header name may not be set here (Authorization, "
            "Proxy-Authorization, Host, Content-Length, Transfer-Encoding, Connection): the "
            "operator sets Authorization from the Secret (bearer or basic), and a credential "
            "in the resource could be read by anyone who reads it",
            field_path=".name",
        )
    )

    name: str = Field(
        min_length=1,
        max_length=MAX_HEADER_NAME_LENGTH,
        pattern=HEADER_NAME_PATTERN,
        description="The header's name (an HTTP token); not Authorization, "
        "Proxy-Authorization, Host, Content-Length, Transfer-Encoding or Connection.",
    )
    value: str = Field(
        max_length=MAX_HEADER_VALUE_LENGTH,
        pattern=HEADER_VALUE_PATTERN,
        description="The header's value: printable ASCII. Not secret: put credentials in the "
        "Secret.",
    )

    @model_validator(mode="after")
    def _not_reserved(self) -> HttpHeader:
        if self.name.lower() in RESERVED_HEADERS:
            raise ValueError(
                f"header name {self.name!r} may not be set here: for credentials use "
                "metrics.authentication.secretRef with bearer or basic"
            )
        return self


class MetricsAuthentication(CamelModel):
    """How the operator authenticates to the metrics endpoint: credentials and CA from a
    Secret of the policy's namespace (bearer token or basic auth, not both), extra headers."""

    model_config = cel_rules(
        CelRule(
            rule="!(has(self.bearer) && has(self.basic))",
            message="give authentication.bearer or authentication.basic, not both",
        ),
        CelRule(
            rule="has(self.secretRef) || !(has(self.bearer) || has(self.basic) || "
            "(has(self.tls) && !(has(self.tls.insecureSkipVerify) && "
            "self.tls.insecureSkipVerify && !has(self.tls.certKey))))",
            message="authentication.bearer, basic and tls read the Secret: give "
            "authentication.secretRef.name",
            field_path=".secretRef",
            reason="FieldValueRequired",
        ),
        CelRule(
            rule="!has(self.secretRef) || has(self.bearer) || has(self.basic) || has(self.tls)",
            message="authentication.secretRef is not read: add bearer, basic or tls",
            field_path=".secretRef",
        ),
    )

    secret_ref: SecretReference | None = Field(
        default=None,
        description="The Secret (in the policy's namespace) holding the credentials and CA. "
        "The operator reads it when it connects, again when it changes (checked every "
        "minute) and at once when the endpoint answers 401 or 403.",
    )
    bearer: BearerAuthentication | None = Field(
        default=None, description="Send the Secret's token as a bearer token."
    )
    basic: BasicAuthentication | None = Field(
        default=None, description="Send the Secret's user name and password (basic auth)."
    )
    tls: MetricsTls | None = Field(
        default=None,
        description="Verify https against the Secret's CA (without tls: the system's roots), "
        "and optionally present a client certificate.",
    )
    headers: list[HttpHeader] = Field(
        default_factory=list,
        max_length=MAX_HEADERS,
        description=f"Extra request headers (e.g. X-Scope-OrgID); at most {MAX_HEADERS}, "
        "names unique (case-insensitive).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> MetricsAuthentication:
        if self.bearer is not None and self.basic is not None:
            raise ValueError("give authentication.bearer or authentication.basic, not both")
        needs_secret = (
            self.bearer is not None
            or self.basic is not None
            or (
                self.tls is not None
                and not (self.tls.insecure_skip_verify and self.tls.cert_key is None)
            )
        )
        if needs_secret and self.secret_ref is None:
            raise ValueError(
                "authentication.bearer, basic and tls read the Secret: give "
                "authentication.secretRef.name"
            )
        if self.secret_ref is not None and not needs_secret and self.tls is None:
            raise ValueError("authentication.secretRef is not read: add bearer, basic or tls")
        seen: set[str] = set()
        for header in self.headers:
            if header.name.lower() in seen:
                raise ValueError(f"authentication.headers: {header.name!r} is given twice")
            seen.add(header.name.lower())
        return self


class MetricsSource(CamelModel):
    """The queue depth (and arrivals) the policy observes."""

    # The same check as _url_shape, for the API server.
    model_config = cel_rules(
        CelRule(
            rule=f"!has(self.url) || {cel_matches('self.url', URL_PATTERN)}",
            message="url must be http(s)://host[:port][/path]: no other scheme, no "
            "user@ credentials, no query (?...) or fragment (#...)",
            field_path=".url",
        ),
        CelRule(
            rule="!has(self.authentication) || !has(self.authentication.tls) || "
            "!has(self.url) || self.url.startsWith('https://')",
            message="authentication.tls is set but url is http://; use https://",
            field_path=".authentication.tls",
        ),
    )

    type: MetricsSourceType = Field(
        default=MetricsSourceType.PROMETHEUS,
        description="Prometheus, Triton's own /metrics, or a vLLM model server's /metrics "
        "(its waiting requests, vllm:num_requests_waiting).",
    )
    url: str | None = Field(
        default=None,
        max_length=MAX_URL_LENGTH,
        description="Prometheus' base URL or Triton's metrics URL: http(s)://host[:port][/path], "
        "no query or fragment. The operator's settings decide which hosts it may read: by "
        "default in-cluster Services only (see the chart's allowedHosts).",
    )
    query: str | None = Field(
        default=None,
        max_length=MAX_QUERY_LENGTH,
        description="PromQL for the router's queue depth (default: Triton's pending requests "
        "of the router plus those its instances hold at their gate, the routers' gauge "
        "compass_router_gate_waiting).",
    )
    arrivals_query: str | None = Field(
        default=None,
        max_length=MAX_QUERY_LENGTH,
        description="PromQL for the cumulative count of requests that arrived.",
    )
    age_query: str | None = Field(
        default=None,
        max_length=MAX_QUERY_LENGTH,
        description="PromQL for how old, in seconds, the samples behind the queue depth are "
        "(default with the default query: time() - min(timestamp(...)) of the router's "
        "pending-request series). With a custom query and no ageQuery the samples count as "
        "fresh: only a failed read is seen, not a series that stopped moving.",
    )
    authentication: MetricsAuthentication | None = Field(
        default=None,
        description="Credentials (bearer token or basic auth), TLS CA and client certificate "
        "from a Secret of the policy's namespace, and extra headers, for every request to url "
        "(or, without url, to every pod's /metrics). Without it: no credentials, and https "
        "verified against the system's roots.",
    )

    @model_validator(mode="after")
    def _url_shape(self) -> MetricsSource:
        problem = None if self.url is None else url_problem(self.url)
        if problem is not None:
            raise ValueError(f"metrics.url: {problem}")
        auth = self.authentication
        if auth is not None and auth.tls is not None and self.url and self.url[:8] != "https://":
            raise ValueError("metrics.authentication.tls is set but url is http://; use https://")
        return self
