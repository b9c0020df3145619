"""Several pipeline slots on a real Triton: a router of 11 instances with
``compass_pipeline_slots`` 4 runs up to 4 requests' pipelines at once, the rest waiting at its
gate, and binds each request on the table at the pipelines running (each configuration's time x
its ``stretch`` with all 4 running): a request that fits the accurate configuration alone is
bound to the faster one when 4 run. A router of one slot (8 instances) binds as it always did."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ragsim import ACCURATE, FASTEST

from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.triton import TritonRouter, router_instances
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton, assemble_repository
from compass_dev.scenarios import COMPONENTS, rag_sim_triton
from tiers import require_tritonserver

SLOTS = 4
# As many waiters behind the slots as the shipped gate of one slot has (8 instances).
INSTANCES = SLOTS + 7
# rag-sim at three times its recorded latencies (390-990 ms alone): the requests that fill the
# slots have entered the pipeline, and are still running, when the request sent behind them
# binds.
TIME_SCALE = 3.0
SEND_GAP_S = 0.2
# Per the table, ACCURATE takes 10 s alone and 4 x that with every slot busy; FASTEST 1 s
# either way. 18 s left: ACCURATE fits alone (after up to 8 s at a gate of one slot), not
# beside 3 running pipelines (40 s), nor 2 (30 s).
ACCURATE_STRETCH = 4.0
DEADLINE_S = 18.0
BURST = 8


def _table(slots: int) -> dict[str, Any]:
    return {
        "stages": [list(names) for names in RAG_SIM_STAGE_PARAMS],
        "components": list(RAG_SIM_COMPONENTS),
        "configs": [
            {
                "config": config_key(FASTEST),
                "accuracy": 0.80,
                "stage_ms": [0.0, 0.0, 1_000.0],
                "stretch": 1.0,
            },
            {
                "config": config_key(ACCURATE),
                "accuracy": 0.86,
                "stage_ms": [0.0, 0.0, 10_000.0],
                "stretch": ACCURATE_STRETCH,
            },
        ],
        "slo_ms": 60_000.0,
        "slots": slots,
    }


@dataclass(frozen=True)
class Pod:
    """A running rag-sim server and its router's client."""

    router: TritonRouter
    server: LocalTriton


def _server(workdir: Path, instances: int, slots: int) -> Iterator[Pod]:
    require_tritonserver()
    server: LocalTriton = rag_sim_triton(
        workdir, TIME_SCALE, FASTEST, router_instances=instances, pipeline_slots=slots
    ).start(workdir)
    client = TritonRouter(server.grpc_url, backoff_s=0.05)
    try:
        client.binding = _table(slots)
        client.switch(FASTEST)
        yield Pod(client, server)
    finally:
        client.close()
        server.stop()


@pytest.fixture(scope="module")
def four_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """rag-sim behind a gate of 11 instances and 4 slots, the table's slots 4."""
    yield from _server(tmp_path_factory.mktemp("slots4"), INSTANCES, SLOTS)


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """rag-sim behind the shipped gate of 8 instances and 1 slot, the table's slots 1."""
    yield from _server(tmp_path_factory.mktemp("slots1"), 8, 1)


def _waiting_at_the_gate(pod: Pod) -> list[float]:
    """What the operator's queue reading sees, every 10 ms, while BURST requests (ACCURATE,
    overridden) sent at once run through the pod: the requests waiting at the gate."""
    depth = TritonQueueDepth(pod.server.metrics_url)
    seen: list[float] = []
    with ThreadPoolExecutor(max_workers=BURST) as pool:
        burst = [pool.submit(pod.router.infer, {"sample": i}, ACCURATE) for i in range(BURST)]
        while not all(request.done() for request in burst):
            seen.append(depth.read().queue_depth)
            time.sleep(0.01)
        for request in burst:
            request.result()
    return seen


def _behind_three_running(router: TritonRouter) -> str:
    """The configuration a request with DEADLINE_S left is bound to when sent SEND_GAP_S after
    three requests (ACCURATE, overridden) that take the pipeline."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        blockers = [pool.submit(router.infer, {"sample": 90 + i}, ACCURATE) for i in range(3)]
        time.sleep(SEND_GAP_S)
        probe = router.infer({"sample": 1}, deadline_ns=time.time_ns() + round(DEADLINE_S * 1e9))
        for blocker in blockers:
            blocker.result()
    return probe.config


def test_the_images_gated4_config_runs_the_router_behind_a_gate_of_four_slots(
    tmp_path: Path,
) -> None:
    """model-images/rag-sim/models/router/configs/gated4.pbtxt: 11 instances, 4 slots, and
    the control reply reports that gate (what PerRequestBinding compares with the plan's)."""
    require_tritonserver()
    repository = assemble_repository(
        "rag-sim", tmp_path / "models", {c: {"time_scale": "0"} for c in COMPONENTS}
    )
    flags = ("--model-config-name=gated4",)
    server = LocalTriton(repository=repository, extra_args=flags).start(tmp_path)
    router = TritonRouter(server.grpc_url, backoff_s=0.05)
    try:
        assert router_instances(router.model_config()) == INSTANCES
        router.binding = _table(SLOTS)
        router.switch(FASTEST)
        assert router.serving().gate == (INSTANCES, SLOTS)
    finally:
        router.close()
        server.stop()


def test_the_router_reports_its_gate_of_four_slots(four_slots: Pod) -> None:
    assert four_slots.router.serving().gate == (INSTANCES, SLOTS)


def test_four_requests_run_the_pipeline_at_once_and_the_rest_wait_at_the_gate(
    four_slots: Pod,
) -> None:
    seen = _waiting_at_the_gate(four_slots)
    # All 8 taken up by the 11 instances: 4 in the pipeline, never more, and 4 waiting.
    assert max(seen) == BURST - SLOTS, seen
    assert TritonQueueDepth(four_slots.server.metrics_url).read().queue_depth == 0


def test_a_request_that_fits_the_accurate_one_alone_is_bound_faster_beside_three_running(
    four_slots: Pod,
) -> None:
    router = four_slots.router
    alone = router.infer({"sample": 0}, deadline_ns=time.time_ns() + round(DEADLINE_S * 1e9))
    assert alone.config == config_key(ACCURATE)
    # With 4 pipelines running ACCURATE takes 40 s per the table: past the 18 s left.
    assert _behind_three_running(router) == config_key(FASTEST)


def test_one_slot_runs_one_pipeline_at_a_time_and_binds_the_request_alone(one_slot: Pod) -> None:
    assert one_slot.router.serving().gate == (8, 1)
    # 8 taken up by 8 instances, one in the pipeline: 7 waiting.
    assert max(_waiting_at_the_gate(one_slot)) == BURST - 1
    # The same request waits at the gate for the three ahead, then runs alone: ACCURATE (its
    # 10 s fits what is left of 18 s), the table's stretch not applying to one slot.
    assert _behind_three_running(one_slot.router) == config_key(ACCURATE)
