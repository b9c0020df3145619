"""Concurrency on a real Triton: a router of several instances, a batching generator, and the
capacity curve the profiler measures."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from ragsim import ACCURATE, FASTEST, TIME_SCALE

from compass.dataplane.profiler import (
    CurveSettings,
    ProfileSettings,
    measure_curve,
    profile_configuration,
)
from compass.dataplane.triton import TritonRouter
from compass.domain.capacity import CurvePoint
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import rag_sim_triton
from tiers import require_tritonserver

SERVERS = 4


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """rag-sim with a router of four instances, FASTEST active."""
    require_tritonserver()
    workdir = tmp_path_factory.mktemp("concurrent")
    server = rag_sim_triton(workdir, TIME_SCALE, FASTEST, router_instances=SERVERS)
    server.start(workdir)
    yield server
    server.stop()


def _router_instances(server: LocalTriton) -> int:
    client = TritonRouter(server.grpc_url)
    try:
        groups = client.model_config()["instance_group"]
    finally:
        client.close()
    return sum(int(group["count"]) for group in groups)


def _generator_inputs(config: dict[str, object]) -> list[grpcclient.InferInput]:
    """One generator request of this configuration at its median latency (batch of one)."""
    values = {
        "CONFIG": (np.array([[json.dumps(config, sort_keys=True).encode()]], np.object_), "BYTES"),
        "SAMPLE": (np.array([[0]], np.int64), "INT64"),
        "QUANTILE": (np.array([[0.5]], np.float32), "FP32"),
    }
    inputs = []
    for name, (array, dtype) in values.items():
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_the_generator_batches_requests_that_wait_together(concurrent: LocalTriton) -> None:
    """Eight requests at once take far less than eight times one: the batch costs 1 + 0.25 (n-1)."""
    client = grpcclient.InferenceServerClient(concurrent.grpc_url)
    try:
        started = time.perf_counter()
        client.infer("generator", _generator_inputs(ACCURATE))
        alone = time.perf_counter() - started
        done = threading.Semaphore(0)
        errors: list[object] = []

        def callback(result: object, error: object) -> None:
            if error is not None:
                errors.append(error)
            done.release()

        started = time.perf_counter()
        for _ in range(8):
            client.async_infer("generator", _generator_inputs(ACCURATE), callback)
        for _ in range(8):
            done.acquire()
        together = time.perf_counter() - started
    finally:
        client.close()
    assert not errors
    # Sequential would be 8x; one batch of 8 is 2.75x, or a batch of 1 then one of 7: 3.5x.
    assert together < 4.5 * alone, f"8 together {together:.3f}s, one {alone:.3f}s"


def test_the_router_runs_the_instances_it_was_given(concurrent: LocalTriton) -> None:
    assert _router_instances(concurrent) == SERVERS


def test_the_curve_of_four_instances_saturates_beyond_one_server(
    concurrent: LocalTriton, tmp_path: Path
) -> None:
    """Measured open loop, with a per-request override: production traffic keeps FASTEST."""
    router = TritonRouter(concurrent.grpc_url)
    router.switch(FASTEST)
    seen: list[CurvePoint] = []
    try:
        profile = profile_configuration(
            router, ACCURATE, ProfileSettings(2, 20), lambda i: {"sample": i % 100}
        )
        curve = measure_curve(
            router,
            ACCURATE,
            profile["latency_mean_ms"],
            SERVERS,
            lambda i: {"sample": i % 100},
            CurveSettings(requests_per_rate=80, max_points=10, seconds_per_rate=0),
            progress=seen.append,
            idle_p95_ms=profile["latency_p95_ms"],
        )
        active = router.active_config()
    finally:
        router.close()
    assert active == config_key(FASTEST)
    assert len(seen) == len(curve.points) <= 10
    assert curve.servers == SERVERS
    assert curve.saturated
    one_server = 1000 / profile["latency_mean_ms"]
    # Pipelining and the generator's batches serve more than one request at a time.
    assert curve.saturation_qps > 1.2 * one_server
    rates = [point.offered_qps for point in curve.points]
    assert rates == sorted(rates)
    # Latency grows with the load: the saturated rate's p95 is above the lowest rate's.
    assert curve.points[-1].latency_at(95) > curve.points[0].latency_at(95)
