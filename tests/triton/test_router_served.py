"""What the router served, counted by the router on a real Triton: every request it answers
under the configuration that served it (routed, or bound stage by stage), none of the
overrides (search and profiling's), and the requests it refused as late; read back by the
operator's direct scrape of the pod and through a real Prometheus, as status.served reads them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ragsim import ACCURATE, FASTEST, depth_or_none

from compass.dataplane.metrics import (
    PrometheusQueueDepth,
    TritonQueueDepth,
)
from compass.dataplane.triton import RoutingError, TritonRouter
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.served import ServedCounts
from compass.domain.space import config_key
from compass_dev.local_triton import LocalPrometheus, LocalTriton
from compass_dev.processes import wait_for
from compass_dev.scenarios import rag_sim_triton
from tiers import require_prometheus, require_tritonserver

ROUTED, BOUND, OVERRIDDEN = 7, 4, 3


def _table() -> dict[str, Any]:
    """Late binding between FASTEST (1 ms) and ACCURATE (2 ms), refusing what is late: with
    seconds left every request binds ACCURATE; one past its deadline is refused."""
    return {
        "stages": [list(names) for names in RAG_SIM_STAGE_PARAMS],
        "components": list(RAG_SIM_COMPONENTS),
        "configs": [
            {"config": config_key(FASTEST), "accuracy": 0.80, "stage_ms": [0.0, 0.0, 1.0]},
            {"config": config_key(ACCURATE), "accuracy": 0.86, "stage_ms": [0.0, 0.0, 2.0]},
        ],
        "refuse": True,
    }


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonRouter, LocalTriton]]:
    """rag-sim without latencies, a router of 2 instances routed to FASTEST."""
    require_tritonserver()
    workdir = tmp_path_factory.mktemp("served")
    server = rag_sim_triton(workdir, 0.0, FASTEST, router_instances=2).start(workdir)
    router = TritonRouter(server.grpc_url, backoff_s=0.05)
    try:
        router.switch(FASTEST)
        yield router, server
    finally:
        router.close()
        server.stop()


def _serve_the_mix(router: TritonRouter) -> None:
    """ROUTED requests as routed, BOUND bound with time to spare, OVERRIDDEN overridden, and
    one refused (bound, its deadline gone)."""
    for sample in range(ROUTED):
        assert router.infer({"sample": sample}).config == config_key(FASTEST)
    for sample in range(OVERRIDDEN):
        router.infer({"sample": sample}, config=ACCURATE)
    router.binding = _table()
    router.switch(FASTEST)
    try:
        for sample in range(BOUND):
            reply = router.infer({"sample": sample}, deadline_ns=time.time_ns() + 10**10)
            assert reply.config == config_key(ACCURATE)
        with pytest.raises(RoutingError, match="late"):
            router.infer({"sample": 0}, deadline_ns=time.time_ns() - 10**9)
    finally:
        router.binding = None
        router.switch(FASTEST)


def test_the_router_counts_what_it_served_by_configuration_and_what_it_refused(
    pod: tuple[TritonRouter, LocalTriton],
) -> None:
    router, server = pod
    scrape = TritonQueueDepth(server.metrics_url)
    scrape.read()
    _serve_the_mix(router)
    scrape.read()
    # From one reading to the next: a series new since counts whole.
    served = scrape.served(60.0)
    assert served is not None
    # Both instances' counters together; the overrides are not production traffic.
    assert dict(served.configs) == {config_key(FASTEST): ROUTED, config_key(ACCURATE): BOUND}
    assert served.refused == 1


def test_prometheus_reads_what_the_routers_served(
    pod: tuple[TritonRouter, LocalTriton], tmp_path: Path
) -> None:
    require_prometheus()
    router, server = pod
    prometheus = LocalPrometheus(targets=[f"127.0.0.1:{server.metrics_port}"], interval_s=0.2)
    prometheus.start(tmp_path)
    try:
        source = PrometheusQueueDepth(prometheus.url, model="router")
        # increase() counts from a series' first sample: one request of each configuration
        # first, so that both series are there before the mix (as they are on a live router).
        router.infer({"sample": 0})
        router.infer({"sample": 0}, config=ACCURATE)  # an override: counted under no series
        _serve_the_mix(router)
        wait_for(lambda: depth_or_none(source) is not None, 10, "Prometheus's first scrape")
        time.sleep(0.5)  # a few scrapes with the counters as they are now
        _serve_the_mix(router)

        def counted() -> ServedCounts | None:
            served = source.served(60.0)
            complete = served is not None and served.refused > 0
            return served if complete and config_key(ACCURATE) in served.configs else None

        served = wait_for(counted, 10, "the mix in Prometheus")
        assert served is not None
        # increase() extrapolates to the window's edges: the counts are about, not exactly,
        # what was served; which configuration served what is exact.
        assert served.configs[config_key(FASTEST)] > served.configs[config_key(ACCURATE)] > 0
        assert set(served.configs) == {config_key(FASTEST), config_key(ACCURATE)}
    finally:
        prometheus.stop()
