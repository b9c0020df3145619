"""Every number read from a metrics endpoint is checked where it enters: finite, and in range (a
queue or a counter is not negative, a sample's age is within a day). A bad one is a failed read
naming the number and where it came from, so the policy holds as for a missing metric: never an
exception further on (an age of 1e300 s once raised OverflowError stamping the status every tick)
nor a wrong decision (a queue of -1e9 read as steady, +Inf as no pressure)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import pytest

from compass.dataplane.fleet import Endpoint, FleetQueueDepth
from compass.dataplane.live import LiveLoop
from compass.dataplane.metrics import (
    MetricsUnavailableError,
    PrometheusQueueDepth,
    TritonQueueDepth,
)
from compass_dev.processes import QuietHandler, serve_http

QUEUE, ARRIVALS, AGE = "queue_q", "arrivals_q", "age_q"


@pytest.fixture
def prometheus() -> Iterator[dict[str, str]]:
    """A Prometheus stand-in answering each query with the value the test sets (a string, as
    Prometheus sends it: "+Inf", "1e300")."""
    values = {QUEUE: "3", ARRIVALS: "100", AGE: "1.5"}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)["query"][0]
            answer = {"status": "success", "data": {"result": [{"value": [1, values[query]]}]}}
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(answer).encode())

    with serve_http(Handler) as address:
        values["url"] = f"http://{address}"
        yield values


def _prometheus(values: dict[str, str]) -> PrometheusQueueDepth:
    return PrometheusQueueDepth(values["url"], QUEUE, arrivals_query=ARRIVALS, age_query=AGE)


def test_a_sane_answer_reads(prometheus: dict[str, str]) -> None:
    reading = _prometheus(prometheus).read()
    assert (reading.queue_depth, reading.arrivals_total, reading.age_s) == (3.0, 100.0, 1.5)


@pytest.mark.parametrize(
    ("query", "value", "said"),
    [
        (QUEUE, "+Inf", "queue depth +Inf is not a finite number"),
        (QUEUE, "-Inf", "queue depth -Inf is not a finite number"),
        (QUEUE, "-1e9", "queue depth -1e+09 is negative"),
        (QUEUE, "1e300", "queue depth 1e+300 is above"),
        (ARRIVALS, "-5", "arrivals counter -5 is negative"),
        (ARRIVALS, "+Inf", "arrivals counter +Inf is not a finite number"),
        (AGE, "+Inf", "sample age +Inf is not a finite number"),
        (AGE, "1e300", "sample age 1e+300 s is more than a day"),
        (AGE, "-1e300", "stamped 1e+300 s in the future"),
    ],
)
def test_a_number_out_of_range_is_a_failed_read_naming_it(
    prometheus: dict[str, str], query: str, value: str, said: str
) -> None:
    prometheus[query] = value
    with pytest.raises(MetricsUnavailableError) as caught:
        _prometheus(prometheus).read()
    assert said in str(caught.value)
    assert f"query {query}" in str(caught.value)


def test_a_slightly_future_sample_counts_as_fresh(prometheus: dict[str, str]) -> None:
    """An exporter's clock a little ahead: age 0, as before."""
    prometheus[AGE] = "-2"
    assert _prometheus(prometheus).read().age_s == 0.0


def test_the_live_loop_holds_on_a_bad_number_instead_of_raising(
    prometheus: dict[str, str],
) -> None:
    """observe() gives no observation and the reason: the policy holds as for a lost metric."""
    prometheus[AGE] = "1e300"
    loop = LiveLoop(policy=None, source=_prometheus(prometheus), router=None)  # type: ignore[arg-type]
    observation, problem = loop.observe(1_700_000_000.0)
    assert observation is None
    assert problem is not None
    assert "sample age 1e+300 s" in problem


@pytest.fixture
def triton() -> Iterator[dict[str, str]]:
    """A Triton /metrics stand-in whose sample values the test sets."""
    values = {"pending": "2", "success": "10"}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            body = "\n".join(
                [
                    f'nv_inference_request_success{{model="router"}} {values["success"]}',
                    'nv_inference_request_failure{model="router"} 0',
                    f'nv_inference_pending_request_count{{model="router"}} {values["pending"]}',
                ]
            )
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

    with serve_http(Handler) as address:
        values["url"] = f"http://{address}/metrics"
        yield values


@pytest.mark.parametrize(
    ("series", "value", "said"),
    [
        ("pending", "+Inf", "+Inf is not a finite number"),
        ("pending", "NaN", "NaN is not a finite number"),
        ("pending", "-1e9", "-1e+09 is negative"),
        ("success", "-3", "-3 is negative"),
        ("success", "1e300", "1e+300 is above"),
    ],
)
def test_a_bad_triton_sample_is_a_failed_read_for_the_pod_and_the_fleet(
    triton: dict[str, str], series: str, value: str, said: str
) -> None:
    triton[series] = value
    with pytest.raises(MetricsUnavailableError, match=said.replace("+", r"\+")):
        TritonQueueDepth(triton["url"]).read()
    fleet = FleetQueueDepth(lambda: [Endpoint("pod-0", "pod-0:8001", triton["url"])])
    with pytest.raises(MetricsUnavailableError, match=said.replace("+", r"\+")):
        fleet.read()
