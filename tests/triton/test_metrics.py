"""Queue depth read from a real Triton, directly and through a real Prometheus."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ragsim import ACCURATE, FASTEST

from compass.api.paretopolicy import ParetoPolicySpec
from compass.conversion import runtime_policy
from compass.dataplane.live import LiveLoop
from compass.dataplane.load import run_load
from compass.dataplane.metrics import (
    MetricsReading,
    MetricsUnavailableError,
    PrometheusQueueDepth,
    QueueDepthSource,
    TritonQueueDepth,
    source_for,
)
from compass.dataplane.triton import TritonRouter
from compass.domain.policy import Action
from compass.domain.space import config_key
from compass_dev.local_triton import LocalPrometheus, LocalTriton, free_port
from compass_dev.processes import QuietHandler, serve_http
from tiers import require_prometheus


def _peak_depth_during_burst(
    triton: LocalTriton, router: TritonRouter, source: QueueDepthSource, burst: int
) -> tuple[float, float]:
    """Depth before a burst of simultaneous requests, and the peak read while it drains."""
    router.switch(ACCURATE)  # ~26 ms a request at rag-sim's test time scale
    idle = source.read().queue_depth
    peak = 0.0
    draining = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not draining.is_set():
            peak = max(peak, source.read().queue_depth)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    records = run_load(triton.grpc_url, [0.0] * burst, lambda i: {"sample": i % 100})
    time.sleep(0.1)
    draining.set()
    poller.join()
    assert not [r for r in records if r.error]
    return idle, peak


def test_triton_metrics_show_the_router_queue(triton: LocalTriton, router: TritonRouter) -> None:
    source = TritonQueueDepth(triton.metrics_url)
    idle, peak = _peak_depth_during_burst(triton, router, source, burst=60)
    assert idle == 0
    # 60 requests at once: most of them wait behind the one in service.
    assert peak >= 20
    assert source.read().queue_depth == 0


def test_prometheus_query_reads_the_same_queue(
    triton: LocalTriton, router: TritonRouter, prometheus: LocalPrometheus
) -> None:
    source = PrometheusQueueDepth(prometheus.url)
    deadline = time.monotonic() + 10
    while True:  # the first scrape may not have happened yet
        try:
            source.read()
            break
        except MetricsUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    # 150 requests drain in ~4 s, several 0.5 s scrapes.
    idle, peak = _peak_depth_during_burst(triton, router, source, burst=150)
    assert idle == 0
    assert peak >= 20


@pytest.mark.parametrize(
    ("query", "says"),
    [
        pytest.param(
            'sum(nv_inference_pending_request_count{model="no-such-model"}) or vector(0) > 1',
            "no series",
            id="no-series-says-what-to-check",
        ),
        pytest.param(
            "nv_inference_pending_request_count",
            r"series; aggregate them",
            id="several-series-asks-for-an-aggregate",
        ),
    ],
)
def test_prometheus_query_of_not_one_series_says_why(
    prometheus: LocalPrometheus, query: str, says: str
) -> None:
    source = PrometheusQueueDepth(prometheus.url, query)
    with pytest.raises(MetricsUnavailableError, match=says):
        source.read()


@pytest.mark.parametrize("kind", ["triton", "prometheus"])
def test_unreachable_source_is_a_clear_error(kind: str) -> None:
    port = free_port()  # nothing listens there
    source: QueueDepthSource = (
        TritonQueueDepth(f"http://127.0.0.1:{port}/metrics")
        if kind == "triton"
        else PrometheusQueueDepth(f"http://127.0.0.1:{port}")
    )
    with pytest.raises(MetricsUnavailableError, match=f"127.0.0.1:{port}"):
        source.read()


def test_unknown_model_on_triton_metrics_is_a_clear_error(triton: LocalTriton) -> None:
    with pytest.raises(MetricsUnavailableError, match="no such series"):
        TritonQueueDepth(triton.metrics_url, model="no-such-model").read()


def test_unreachable_triton_is_a_routing_error_naming_the_endpoint() -> None:
    from compass.dataplane.triton import RoutingError

    port = free_port()
    router = TritonRouter(f"127.0.0.1:{port}", attempts=2, backoff_s=0.01, timeout_s=2)
    with pytest.raises(RoutingError, match=f"127.0.0.1:{port}"):
        router.switch(ACCURATE)
    with pytest.raises(RoutingError, match=f"127.0.0.1:{port}"):
        router.infer({"sample": 0})


def _first_reading(source: QueueDepthSource, timeout_s: float = 15.0) -> MetricsReading:
    """The source's first reading, once Prometheus has scraped."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return source.read()
        except MetricsUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_live_series_reads_as_fresh(
    triton: LocalTriton, router: TritonRouter, prometheus: LocalPrometheus
) -> None:
    """Scraped every 0.5 s: the samples behind the queue depth are at most a scrape or two old."""
    reading = _first_reading(source_for("prometheus", prometheus.url))
    assert 0.0 <= reading.age_s < 2.0


@dataclass
class Exporter:
    """The router's series at an address, stamped with the time of each scrape until frozen:
    from then on every scrape gives the same samples with the same timestamp (explicit
    timestamps, so Prometheus marks nothing stale and keeps answering with them)."""

    address: str = ""
    frozen_at: float | None = None

    def page(self) -> bytes:
        stamp = int((self.frozen_at or time.time()) * 1000)
        return "".join(
            f'{name}{{model="router",version="1"}} {value} {stamp}\n'
            for name, value in (
                ("nv_inference_pending_request_count", 0),
                ("nv_inference_request_success", 40),
                ("nv_inference_request_failure", 0),
            )
        ).encode()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    """An Exporter serving on loopback."""
    exporter = Exporter()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(exporter.page())

    with serve_http(Handler) as exporter.address:
        yield exporter


STALE_AFTER_S = 3.0


def test_a_series_that_stopped_moving_is_stale_and_the_loop_falls_back_to_the_fastest(
    exporter: Exporter, router: TritonRouter, tmp_path: Path
) -> None:
    """A real Prometheus answers a frozen series with its last sample for minutes, stamped with
    the time of the query: the reading's age comes from the sample's own timestamp, and once it
    passes staleAfterSeconds the loop leaves the accurate configuration for the fastest."""
    require_prometheus()
    prometheus = LocalPrometheus(targets=[exporter.address], interval_s=0.5).start(tmp_path)
    try:
        source = source_for("prometheus", prometheus.url)
        assert _first_reading(source).age_s < 2.0
        policy = runtime_policy(
            ParetoPolicySpec.model_validate(
                {
                    "front": [
                        {
                            "config": FASTEST,
                            "accuracy": 0.83,
                            "latencyMeanMs": 20,
                            "latencyP95Ms": 23,
                        },
                        {
                            "config": ACCURATE,
                            "accuracy": 0.86,
                            "latencyMeanMs": 33,
                            "latencyP95Ms": 37,
                        },
                    ],
                    "slo": {"latencyMs": 1000},
                    "staleAfterSeconds": STALE_AFTER_S,
                }
            )
        )
        router.switch(ACCURATE)
        loop = LiveLoop(policy, source, router)
        state = loop.initial_state(time.time())
        decisions = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if exporter.frozen_at is None and len(decisions) == 4:
                exporter.frozen_at = time.time()  # the series stops moving
            result = loop.step(state, time.time())
            assert result.observation is not None  # read fine every time, only older
            state = result.state
            age = 0.0 if exporter.frozen_at is None else time.time() - exporter.frozen_at
            decisions.append((age, result.decision))
            if result.decision.action is Action.FALLBACK:
                break
            time.sleep(0.5)
        # Prometheus still answers with the frozen sample, as old as it really is.
        assert exporter.frozen_at is not None
        later = source.read()
        assert later.queue_depth == 0
        assert later.age_s == pytest.approx(time.time() - exporter.frozen_at, abs=0.7)
        held = [age for age, d in decisions if d.action is Action.HOLD]
        [(fell_at, fallback)] = [(age, d) for age, d in decisions if d.action is Action.FALLBACK]
        assert held
        assert max(held) <= STALE_AFTER_S + 0.2
        assert STALE_AFTER_S < fell_at < STALE_AFTER_S + 2.0
        assert "metrics stale" in fallback.reason
        assert router.active_config() == config_key(FASTEST)
    finally:
        prometheus.stop()
