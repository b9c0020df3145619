"""Queue depth read from a real Triton, directly and through a real Prometheus."""

from __future__ import annotations

import threading
import time

import pytest
from ragsim import ACCURATE

from compass.dataplane.load import run_load
from compass.dataplane.metrics import (
    MetricsUnavailableError,
    PrometheusQueueDepth,
    QueueDepthSource,
    TritonQueueDepth,
)
from compass.dataplane.triton import TritonRouter
from compass.lab.local_triton import LocalPrometheus, LocalTriton, free_port


def _peak_depth_during_burst(
    triton: LocalTriton, router: TritonRouter, source: QueueDepthSource, burst: int
) -> tuple[float, float]:
    """Depth before a burst of simultaneous requests, and the peak read while it drains."""
    router.switch(ACCURATE)  # ~26 ms a request at rag-sim's test time scale
    idle = source.queue_depth()
    peak = 0.0
    draining = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not draining.is_set():
            peak = max(peak, source.queue_depth())
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
    assert source.queue_depth() == 0


def test_prometheus_query_reads_the_same_queue(
    triton: LocalTriton, router: TritonRouter, prometheus: LocalPrometheus
) -> None:
    source = PrometheusQueueDepth(prometheus.url)
    deadline = time.monotonic() + 10
    while True:  # the first scrape may not have happened yet
        try:
            source.queue_depth()
            break
        except MetricsUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    # 150 requests drain in ~4 s, several 0.5 s scrapes.
    idle, peak = _peak_depth_during_burst(triton, router, source, burst=150)
    assert idle == 0
    assert peak >= 20


def test_prometheus_query_with_no_series_says_what_to_check(prometheus: LocalPrometheus) -> None:
    source = PrometheusQueueDepth(
        prometheus.url,
        'sum(nv_inference_pending_request_count{model="no-such-model"}) or vector(0) > 1',
    )
    with pytest.raises(MetricsUnavailableError, match="no series"):
        source.queue_depth()


def test_prometheus_query_with_several_series_asks_for_an_aggregate(
    prometheus: LocalPrometheus,
) -> None:
    source = PrometheusQueueDepth(prometheus.url, "nv_inference_pending_request_count")
    with pytest.raises(MetricsUnavailableError, match=r"series; aggregate them"):
        source.queue_depth()


@pytest.mark.parametrize("kind", ["triton", "prometheus"])
def test_unreachable_source_is_a_clear_error(kind: str) -> None:
    port = free_port()  # nothing listens there
    source: QueueDepthSource = (
        TritonQueueDepth(f"http://127.0.0.1:{port}/metrics")
        if kind == "triton"
        else PrometheusQueueDepth(f"http://127.0.0.1:{port}")
    )
    with pytest.raises(MetricsUnavailableError, match=f"127.0.0.1:{port}"):
        source.queue_depth()


def test_unknown_model_on_triton_metrics_is_a_clear_error(triton: LocalTriton) -> None:
    with pytest.raises(MetricsUnavailableError, match="no such series"):
        TritonQueueDepth(triton.metrics_url, model="no-such-model").queue_depth()


def test_unreachable_triton_is_a_routing_error_naming_the_endpoint() -> None:
    from compass.dataplane.triton import RoutingError

    port = free_port()
    router = TritonRouter(f"127.0.0.1:{port}", attempts=2, backoff_s=0.01, timeout_s=2)
    with pytest.raises(RoutingError, match=f"127.0.0.1:{port}"):
        router.switch(ACCURATE)
    with pytest.raises(RoutingError, match=f"127.0.0.1:{port}"):
        router.infer({"sample": 0})
