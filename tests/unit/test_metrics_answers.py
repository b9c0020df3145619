"""What a metrics endpoint answers never reaches a status or an Event: only the HTTP status and
a fixed reason do. The endpoints here are small HTTP servers on loopback, answering as a hostile
or broken one would."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from compass.controllers import policy_conditions
from compass.dataplane.metrics import (
    MetricsUnavailableError,
    PrometheusQueueDepth,
    QueueDepthSource,
    TritonQueueDepth,
)
from compass_dev.processes import QuietHandler, serve_http

SECRET = "token-3f9a <script>alert(1)</script>"
Answer = tuple[int, dict[str, str], str]


@pytest.fixture
def endpoint() -> Iterator[Callable[[Answer], str]]:
    """Serve one fixed answer (status, headers, body) to every GET; gives the base URL."""

    def serve(answer: Answer) -> str:
        status, headers, body = answer

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.send_response(status, f"reason {SECRET}")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body.encode())

        return f"http://{servers.enter_context(serve_http(Handler))}"

    with contextlib.ExitStack() as servers:
        yield serve


def _sources(base: str) -> list[QueueDepthSource]:
    return [TritonQueueDepth(f"{base}/metrics"), PrometheusQueueDepth(base)]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((500, {}, f"internal error: {SECRET}"), "HTTP 500"),
        ((403, {}, SECRET), "HTTP 403"),
        ((302, {"Location": "http://169.254.169.254/latest"}, SECRET), "not followed"),
        ((200, {}, f'nv_inference_pending_request_count{{model="router"}} {SECRET}'), ""),
        (
            (
                200,
                {},
                '{"status": "success", "data": {"result": [{"value": [1, "' + SECRET + '"]}]}}',
            ),
            "",
        ),
        ((200, {}, '{"data": "' + SECRET + '"}'), ""),
    ],
)
def test_what_an_endpoint_answers_stays_out_of_conditions_and_events(
    endpoint: Callable[[Answer], str], answer: Answer, said: str
) -> None:
    base = endpoint(answer)
    for source in _sources(base):
        with pytest.raises(MetricsUnavailableError) as error:
            source.read()
        message = str(error.value)
        assert said in message
        assert "token" not in message, message
        assert "script" not in message, message
        # The message is what the conditions and the MetricsLost Event carry.
        health = policy_conditions.Health(
            metrics_error=f"metrics unavailable: {message}", metrics_read=True, decision="hold"
        )
        conditions = policy_conditions.merge_conditions(
            [], policy_conditions.health_conditions(health), "2026-01-01T00:00:00Z", 1
        )
        events = policy_conditions.transition_events([], conditions)
        assert events
        assert all("token" not in e.message for e in events)
        assert all("token" not in str(c.get("message")) for c in conditions)


def test_a_redirect_is_not_followed(endpoint: Callable[[Answer], str]) -> None:
    """Following it would read a host no one checked; the target is never asked."""
    target = endpoint((200, {}, 'nv_inference_pending_request_count{model="router"} 3\n'))
    base = endpoint((302, {"Location": f"{target}/metrics"}, ""))
    with pytest.raises(MetricsUnavailableError, match="HTTP 302: redirects are not followed"):
        TritonQueueDepth(f"{base}/metrics").read()
    with pytest.raises(MetricsUnavailableError, match="redirects are not followed"):
        PrometheusQueueDepth(base).read()


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://prom:9090/?x=", "ftp://h/metrics"])
def test_the_data_plane_reads_http_urls_only(url: str) -> None:
    for make in (TritonQueueDepth, PrometheusQueueDepth):
        with pytest.raises(ValueError, match="metrics URL"):
            make(url)
