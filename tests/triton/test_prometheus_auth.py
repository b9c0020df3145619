"""The operator's metrics reader against a real Prometheus behind basic auth and TLS (its
--web.config.file), with a CA made here: the queue is read with the right credentials and CA,
wrong credentials are a fixed message naming the status, and without the CA the server's
certificate is not trusted. (Prometheus has no bearer auth; tests/unit/test_metrics_auth.py
checks the bearer header against a loopback server.)
"""

from __future__ import annotations

import base64
import ssl
import time
from collections.abc import Iterator

import bcrypt
import pytest
from tls_certs import Tls, make_tls

from compass.api.metricsource import MetricsAuthentication
from compass.controllers import metricsauth
from compass.dataplane.httpauth import HttpAuth
from compass.dataplane.metrics import MetricsUnavailableError, PrometheusQueueDepth
from compass_dev.local_triton import LocalPrometheus
from compass_dev.processes import QuietHandler, serve_http
from tiers import require_prometheus

USER = "compass"
PASSWORD = "pr0m-s3cret-Password"
QUEUE = 7


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """A Triton-shaped /metrics page on loopback: the router's queue is QUEUE."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(
                f'nv_inference_pending_request_count{{model="router",version="1"}} {QUEUE}\n'.encode()
            )

    with serve_http(Handler) as address:
        yield address


@pytest.fixture(scope="module")
def secured(
    exporter: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalPrometheus, Tls]]:
    """Prometheus serving https only, to USER:PASSWORD only, scraping the exporter."""
    require_prometheus()
    workdir = tmp_path_factory.mktemp("prometheus-auth")
    tls = make_tls(workdir)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web_config = workdir / "web.yml"
    web_config.write_text(
        "tls_server_config:\n"
        f"  cert_file: {tls.cert}\n"
        f"  key_file: {tls.key}\n"
        "basic_auth_users:\n"
        f"  {USER}: '{hashed}'\n",
        encoding="utf-8",
    )
    pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    server = LocalPrometheus(
        targets=[exporter],
        interval_s=0.5,
        web_config=web_config,
        tls=True,
        ready_headers={"Authorization": f"Basic {pair}"},
        ready_context=ssl.create_default_context(cafile=str(tls.ca)),
    )
    server.start(workdir)
    yield server, tls
    server.stop()


def _secret(tls: Tls, password: str = PASSWORD) -> dict[str, object]:
    """The Secret as the API server returns it."""
    data = {"username": USER, "password": password, "ca.crt": tls.ca.read_text()}
    return {
        "metadata": {
            "name": "prom-auth",
            "resourceVersion": "1",
            "labels": {metricsauth.CONSENT_LABEL: "true"},
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


SPEC = MetricsAuthentication.model_validate(
    {"secretRef": {"name": "prom-auth"}, "basic": {}, "tls": {}}
)


def _first_queue(source: PrometheusQueueDepth) -> float:
    """The queue depth once Prometheus has scraped the exporter (its first scrape may not have
    happened yet; up to 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return source.read().queue_depth
        except MetricsUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_queue_is_read_with_the_secrets_credentials_and_ca(
    secured: tuple[LocalPrometheus, Tls],
) -> None:
    prometheus, tls = secured
    auth = metricsauth.credentials(SPEC, _secret(tls), "team")
    source = PrometheusQueueDepth(prometheus.url, auth=auth)
    assert _first_queue(source) == QUEUE
    assert not source.auth_rejected


def test_wrong_credentials_are_the_status_and_a_fixed_reason(
    secured: tuple[LocalPrometheus, Tls],
) -> None:
    prometheus, tls = secured
    for auth in (
        metricsauth.credentials(SPEC, _secret(tls, password="not-the-password"), "team"),
        HttpAuth(ca_pem=tls.ca.read_text()),  # no credentials at all
    ):
        source = PrometheusQueueDepth(prometheus.url, auth=auth)
        with pytest.raises(MetricsUnavailableError) as error:
            source.read()
        message = str(error.value)
        assert message.startswith(f"Prometheus {prometheus.url} query ")
        assert message.endswith(
            "HTTP 401: the credentials were refused; check the Secret's values "
            "(metrics.authentication)"
            if auth.username
            else "HTTP 401: the endpoint requires authentication; set metrics.authentication"
        )
        assert "Unauthorized" not in message  # Prometheus' own words stay out
        assert "not-the-password" not in message
        assert source.auth_rejected


def test_without_the_ca_the_server_is_not_trusted(secured: tuple[LocalPrometheus, Tls]) -> None:
    prometheus, _ = secured
    # The right credentials, but the system's roots: they are never sent to an unverified host.
    source = PrometheusQueueDepth(prometheus.url, auth=HttpAuth(username=USER, password=PASSWORD))
    with pytest.raises(MetricsUnavailableError) as error:
        source.read()
    assert str(error.value).endswith(
        "TLS: the server's certificate is not signed by a trusted CA; give its CA "
        "(metrics.authentication.tls.caKey)"
    )
    # Over plain http, Prometheus' TLS port refuses the request.
    plain = PrometheusQueueDepth(prometheus.url.replace("https://", "http://"))
    with pytest.raises(MetricsUnavailableError, match="HTTP 400"):
        plain.read()


def test_skipping_verification_must_be_asked_for(secured: tuple[LocalPrometheus, Tls]) -> None:
    prometheus, _ = secured
    spec = MetricsAuthentication.model_validate(
        {"secretRef": {"name": "prom-auth"}, "basic": {}, "tls": {"insecureSkipVerify": True}}
    )
    secret = {
        "metadata": {"resourceVersion": "1", "labels": {metricsauth.CONSENT_LABEL: "true"}},
        "data": {
            "username": base64.b64encode(USER.encode()).decode(),
            "password": base64.b64encode(PASSWORD.encode()).decode(),
        },
    }
    auth = metricsauth.credentials(spec, secret, "team")
    assert PrometheusQueueDepth(prometheus.url, auth=auth).read().queue_depth == QUEUE


@pytest.fixture(scope="module")
def mutual(
    exporter: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalPrometheus, Tls]]:
    """Prometheus serving https only to clients with a certificate its CA signed (mutual TLS)."""
    require_prometheus()
    workdir = tmp_path_factory.mktemp("prometheus-mtls")
    tls = make_tls(workdir)
    web_config = workdir / "web.yml"
    web_config.write_text(
        "tls_server_config:\n"
        f"  cert_file: {tls.cert}\n"
        f"  key_file: {tls.key}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {tls.ca}\n",
        encoding="utf-8",
    )
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.load_cert_chain(tls.client_cert, tls.client_key)
    server = LocalPrometheus(
        targets=[exporter],
        interval_s=0.5,
        web_config=web_config,
        tls=True,
        ready_context=context,
    )
    server.start(workdir)
    yield server, tls
    server.stop()


def test_a_client_certificate_from_the_secret_is_presented(
    mutual: tuple[LocalPrometheus, Tls],
) -> None:
    prometheus, tls = mutual
    spec = MetricsAuthentication.model_validate(
        {
            "secretRef": {"name": "prom-mtls"},
            "tls": {"caKey": "ca.pem", "certKey": "client.pem", "keyKey": "client-key.pem"},
        }
    )
    files = {"ca.pem": tls.ca, "client.pem": tls.client_cert, "client-key.pem": tls.client_key}
    secret = {
        "metadata": {"resourceVersion": "1", "labels": {metricsauth.CONSENT_LABEL: "true"}},
        "data": {k: base64.b64encode(v.read_bytes()).decode() for k, v in files.items()},
    }
    source = PrometheusQueueDepth(prometheus.url, auth=metricsauth.credentials(spec, secret, "t"))
    assert _first_queue(source) == QUEUE
    # The CA alone, no client certificate: the handshake fails, in fixed words.
    alone = PrometheusQueueDepth(prometheus.url, auth=HttpAuth(ca_pem=tls.ca.read_text()))
    with pytest.raises(MetricsUnavailableError, match="TLS handshake failed"):
        alone.read()
