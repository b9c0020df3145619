"""Authenticated metrics: what the Secret must hold (and what the condition says when it does
not, never a value), and that every request carries the credentials and headers and none is
sent on where a redirect points. The endpoints are small HTTP servers on loopback that check the
headers; Prometheus itself, behind basic auth and TLS, is in tests/triton/test_prometheus_auth.py.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from compass.api.metricsource import MetricsAuthentication
from compass.controllers import metricsauth, policy_conditions
from compass.dataplane.fleet import Endpoint, FleetQueueDepth
from compass.dataplane.httpauth import HttpAuth
from compass.dataplane.metrics import (
    MetricsUnavailableError,
    PrometheusQueueDepth,
    TritonQueueDepth,
)
from compass_dev.processes import QuietHandler, serve_http

TOKEN = "s3cr3t-token-value"
PASSWORD = "s3cr3t-password-value"
TRITON_PAGE = 'nv_inference_pending_request_count{model="router"} 4\n'
PROMETHEUS_ANSWER = '{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "4"]}]}}'


@dataclass
class Guarded:
    """A loopback endpoint answering 200 only to ``Authorization: <expected>``, else 401;
    ``redirect`` answers 302 to it instead. Records every request's headers."""

    expected: str
    redirect: str | None = None
    seen: list[dict[str, str]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def guarded() -> Iterator[Any]:
    def start(expected: str, redirect: str | None = None) -> Guarded:
        state = Guarded(expected, redirect)

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                # Header names are case-insensitive (urllib sends X-scope-orgid).
                state.seen.append({k.lower(): v for k, v in self.headers.items()})
                if state.redirect is not None:
                    self.send_response(302)
                    self.send_header("Location", state.redirect + self.path)
                    self.end_headers()
                    return
                if self.headers.get("Authorization") != state.expected:
                    self.send_response(401, "go away")
                    self.end_headers()
                    self.wfile.write(b"denied: " + TOKEN.encode())
                    return
                body = PROMETHEUS_ANSWER if self.path.startswith("/api/v1/") else TRITON_PAGE
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

        state.url = f"http://{servers.enter_context(serve_http(Handler))}"
        return state

    with contextlib.ExitStack() as servers:
        yield start


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_bearer_token_and_headers_reach_every_request(guarded: Any) -> None:
    endpoint = guarded(f"Bearer {TOKEN}")
    auth = HttpAuth(bearer_token=TOKEN, headers=(("X-Scope-OrgID", "team-a"),))
    prometheus = PrometheusQueueDepth(
        endpoint.url, arrivals_query="sum(x)", age_query="time()", auth=auth
    )
    assert prometheus.read().queue_depth == 4
    assert TritonQueueDepth(f"{endpoint.url}/metrics", auth=auth).read().queue_depth == 4
    fleet = FleetQueueDepth(lambda: [Endpoint("pod-0", "", f"{endpoint.url}/metrics")], auth=auth)
    assert fleet.read().queue_depth == 4
    # Three queries (depth, arrivals, age), one scrape, one fleet scrape: every one authenticated.
    assert len(endpoint.seen) == 5
    assert all(h["authorization"] == f"Bearer {TOKEN}" for h in endpoint.seen)
    assert all(h["x-scope-orgid"] == "team-a" for h in endpoint.seen)


def test_basic_auth_is_sent(guarded: Any) -> None:
    endpoint = guarded(_basic("compass", PASSWORD))
    auth = HttpAuth(username="compass", password=PASSWORD)
    assert PrometheusQueueDepth(endpoint.url, auth=auth).read().queue_depth == 4


@pytest.mark.parametrize("make", ["prometheus", "triton"])
def test_refused_credentials_name_the_status_and_no_answer(guarded: Any, make: str) -> None:
    endpoint = guarded(f"Bearer {TOKEN}")
    auth = HttpAuth(bearer_token="wrong")
    source = (
        PrometheusQueueDepth(endpoint.url, auth=auth)
        if make == "prometheus"
        else TritonQueueDepth(f"{endpoint.url}/metrics", auth=auth)
    )
    with pytest.raises(MetricsUnavailableError) as error:
        source.read()
    message = str(error.value)
    assert "HTTP 401: the credentials were refused" in message
    for said in ("go away", TOKEN, "wrong"):  # the server's reason and body, the credential
        assert said not in message
    assert source.auth_rejected  # the controller reads the Secret again


def test_without_credentials_a_401_says_to_set_authentication(guarded: Any) -> None:
    endpoint = guarded(f"Bearer {TOKEN}")
    with pytest.raises(MetricsUnavailableError, match=r"HTTP 401: .* set metrics\.authentication"):
        PrometheusQueueDepth(endpoint.url).read()


def test_credentials_never_follow_a_redirect(guarded: Any) -> None:
    elsewhere = guarded(f"Bearer {TOKEN}")
    redirecting = guarded(f"Bearer {TOKEN}", redirect=elsewhere.url)
    auth = HttpAuth(bearer_token=TOKEN)
    for source in (
        PrometheusQueueDepth(redirecting.url, auth=auth),
        TritonQueueDepth(f"{redirecting.url}/metrics", auth=auth),
    ):
        with pytest.raises(MetricsUnavailableError, match="redirects are not followed"):
            source.read()
    assert elsewhere.seen == []


def test_the_credentials_repr_shows_no_secret() -> None:
    auth = HttpAuth(bearer_token=TOKEN, username="u", password=PASSWORD, ca_pem="PEM")
    for secret in (TOKEN, PASSWORD, "PEM"):
        assert secret not in repr(auth)


# ------------------------------------------------------------------ the Secret


def _secret(version: str = "1", consent: str | None = "true", **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    labels = {} if consent is None else {metricsauth.CONSENT_LABEL: consent}
    metadata = {"name": "prom-auth", "resourceVersion": version, "labels": labels}
    return {"metadata": metadata, "data": encoded}


def _auth(**fields: Any) -> MetricsAuthentication:
    return MetricsAuthentication.model_validate({"secretRef": {"name": "prom-auth"}, **fields})


def test_bearer_token_from_the_default_key_without_its_newline() -> None:
    auth = metricsauth.credentials(
        _auth(bearer={}, headers=[{"name": "X-Scope-OrgID", "value": "a"}]),
        _secret(token=TOKEN + "\n"),
        "team",
    )
    assert auth.request_headers() == {"X-Scope-OrgID": "a", "Authorization": f"Bearer {TOKEN}"}


def test_basic_auth_from_chosen_keys() -> None:
    auth = metricsauth.credentials(
        _auth(basic={"usernameKey": "user", "passwordKey": "pass"}),
        _secret(user="compass", **{"pass": PASSWORD}),
        "team",
    )
    assert auth.request_headers()["Authorization"] == _basic("compass", PASSWORD)


@pytest.mark.parametrize(
    ("auth", "secret", "names"),
    [
        (_auth(bearer={}), None, ["Secret team/prom-auth", "not found", "token", "create it"]),
        # Whoever writes a policy may not send any Secret of the namespace to a URL of theirs.
        (
            _auth(bearer={}),
            _secret(consent=None, token=TOKEN),
            ["Secret team/prom-auth", "not labelled compass.io/metrics-credentials=true"],
        ),
        (
            _auth(bearer={}),
            _secret(consent="yes", token=TOKEN),
            ["kubectl label secret prom-auth -n team compass.io/metrics-credentials=true"],
        ),
        # A header travels as Latin-1: a token outside ASCII would fail every request.
        (
            _auth(bearer={}),
            _secret(token=TOKEN + "\u20ac"),
            ["'token'", "outside printable ASCII"],
        ),
        (
            _auth(basic={}),
            _secret(username="compass", passwd=PASSWORD),
            ["Secret team/prom-auth", "'password'", "basic.passwordKey", "add it"],
        ),
        (
            _auth(bearer={"tokenKey": "api-token"}),
            _secret(token=TOKEN),
            ["'api-token'", "bearer.tokenKey"],
        ),
        (
            _auth(bearer={}),
            _secret(token=f"{TOKEN}\nX-Injected: 1"),
            ["'token'", "control character"],
        ),
        (_auth(bearer={}, tls={}), _secret(token=TOKEN), ["'ca.crt'", "tls.caKey"]),
        (
            _auth(bearer={}, tls={}),
            _secret(token=TOKEN, **{"ca.crt": f"not a certificate {PASSWORD}"}),
            ["tls.caKey", "PEM"],
        ),
    ],
)
def test_what_the_secret_lacks_is_named_and_no_value_is_shown(
    auth: MetricsAuthentication, secret: dict[str, Any] | None, names: list[str]
) -> None:
    with pytest.raises(metricsauth.CredentialsError) as error:
        metricsauth.credentials(auth, secret, "team")
    message = str(error.value)
    for name in names:
        assert name in message, message
    assert TOKEN not in message
    assert PASSWORD not in message
    # The message is what the conditions and the MetricsLost Event carry.
    health = policy_conditions.Health(
        metrics_error=f"metrics unavailable: {message}",
        metrics_reason=metricsauth.REASON,
        metrics_read=True,
        decision="hold",
    )
    conditions = policy_conditions.merge_conditions(
        [], policy_conditions.health_conditions(health), "2026-01-01T00:00:00Z", 1
    )
    available = next(c for c in conditions if c["type"] == "MetricsAvailable")
    assert available["reason"] == metricsauth.REASON
    assert "Secret team/prom-auth" in available["message"]
    events = policy_conditions.transition_events([], conditions)
    assert [e.reason for e in events] == ["MetricsLost"]
    everything = repr(conditions) + repr(events)
    assert TOKEN not in everything
    assert PASSWORD not in everything


def test_headers_alone_need_no_secret() -> None:
    spec = MetricsAuthentication.model_validate(
        {"headers": [{"name": "X-Scope-OrgID", "value": "a"}]}
    )
    assert metricsauth.credentials(spec, None, "team").request_headers() == {"X-Scope-OrgID": "a"}


@pytest.mark.parametrize(
    ("read_at", "now", "available", "rejected", "due"),
    [
        (None, 0.0, True, False, True),
        (0.0, 30.0, True, False, False),
        (0.0, metricsauth.SECRET_RECHECK_S, True, False, True),
        (0.0, metricsauth.SECRET_RETRY_S, False, False, True),
        (0.0, metricsauth.SECRET_RETRY_S, True, True, True),
        (0.0, 1.0, True, True, False),
    ],
)
def test_when_the_secret_is_read_again(
    read_at: float | None, now: float, available: bool, rejected: bool, due: bool
) -> None:
    assert metricsauth.recheck_due(read_at, now, available=available, rejected=rejected) is due


PEM_CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
PEM_KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"


def _tls_secret(labelled: bool = True, **values: str) -> dict[str, Any]:
    labels = {metricsauth.CONSENT_LABEL: "true"} if labelled else {}
    return {
        "metadata": {"name": "triton-tls", "labels": labels},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    }


def test_tls_to_triton_comes_from_a_labelled_secret_with_the_server_name() -> None:
    from compass.api.metricsource import TritonTls

    mutual = TritonTls.model_validate(
        {
            "secretRef": {"name": "triton-tls"},
            "certKey": "tls.crt",
            "keyKey": "tls.key",
            "serverName": "rag-sim-triton.ml.svc",
        }
    )
    secret = _tls_secret(**{"ca.crt": PEM_CA, "tls.crt": PEM_CA, "tls.key": PEM_KEY})
    tls = metricsauth.triton_tls(mutual, secret, "ml", "spec.routing.tls")
    assert (tls.ca_pem, tls.cert_pem, tls.key_pem) == (
        PEM_CA.encode(),
        PEM_CA.encode(),
        PEM_KEY.encode(),
    )
    assert tls.channel_args() == [("grpc.ssl_target_name_override", "rag-sim-triton.ml.svc")]
    plain = TritonTls.model_validate({"secretRef": {"name": "triton-tls"}})
    only_ca = metricsauth.triton_tls(plain, _tls_secret(**{"ca.crt": PEM_CA}), "ml", "f")
    assert (only_ca.cert_pem, only_ca.key_pem, only_ca.channel_args()) == (None, None, [])


@pytest.mark.parametrize(
    ("secret", "needle"),
    [
        (None, "Secret ml/triton-tls (spec.routing.tls.secretRef) not found"),
        (
            _tls_secret(False, **{"ca.crt": PEM_CA}),
            "is not labelled compass.io/metrics-credentials",
        ),
        (_tls_secret(**{"other": PEM_CA}), "has no key 'ca.crt' (spec.routing.tls.caKey)"),
        (_tls_secret(**{"ca.crt": "hello"}), "caKey (spec.routing.tls.caKey) is not PEM"),
    ],
    ids=["missing", "unlabelled", "no-key", "not-pem"],
)
def test_tls_to_triton_names_the_secret_key_and_field_when_it_cannot_be_had(
    secret: dict[str, Any] | None, needle: str
) -> None:
    from compass.api.metricsource import TritonTls

    spec = TritonTls.model_validate({"secretRef": {"name": "triton-tls"}})
    with pytest.raises(metricsauth.CredentialsError, match=re.escape(needle)):
        metricsauth.triton_tls(spec, secret, "ml", "spec.routing.tls")
