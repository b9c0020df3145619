"""The router's gate on a real Triton: a router of 8 instances with ``compass_pipeline_slots``
1 takes a burst up at once and runs it through the pipeline one request at a time, in arrival
order, and the request at the head binds knowing the waiters behind it and their deadlines.
The same burst through the same router without the gate runs several requests at once and
binds the head alone: what the gate's checks would see if the gate did nothing."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from ragsim import ACCURATE, FASTEST, depth_or_none

from compass.dataplane.metrics import (
    PrometheusQueueDepth,
    QueueDepthSource,
    TritonQueueDepth,
)
from compass.dataplane.triton import (
    RouterReply,
    TritonRouter,
    router_instances,
)
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key
from compass_dev.local_triton import LocalPrometheus, LocalTriton, assemble_repository
from compass_dev.processes import wait_for
from compass_dev.scenarios import COMPONENTS, rag_sim_triton
from compass_rules.protocol import GATE_WAITING_METRIC, PIPELINE_SLOTS_PARAMETER
from compass_rules.routing import tables_digest
from tiers import require_prometheus, require_tritonserver

INSTANCES = 8
# The image's gated router config (model-images/rag-sim/models/router/configs/gated.pbtxt).
GATED = "gated"
BURST = 6
# rag-sim at its recorded latencies (130-330 ms): a request that occupies the pipeline
# outlasts sending the burst behind it.
TIME_SCALE = 1.0
SEND_GAP_S = 0.02
# Per the table, ACCURATE takes 10 s, FASTEST 1 s: with 12 s left, ACCURATE fits a request
# alone but not one with BURST - 1 requests behind it that have as long left (the requests
# ahead count a follower's time as the table's SLO from its queueing: a burst's tests set it to
# this, whatever deadline the burst's clients send).
DEADLINE_S = 12.0
# How far client-side timing of the answers may be off on a busy machine.
SLACK_S = 0.04


def _table() -> dict[str, Any]:
    return {
        "stages": [list(names) for names in RAG_SIM_STAGE_PARAMS],
        "components": list(RAG_SIM_COMPONENTS),
        "configs": [
            {"config": config_key(FASTEST), "accuracy": 0.80, "stage_ms": [0.0, 0.0, 1_000.0]},
            {"config": config_key(ACCURATE), "accuracy": 0.86, "stage_ms": [0.0, 0.0, 10_000.0]},
        ],
        "slo_ms": 60_000.0,
    }


@dataclass(frozen=True)
class Pod:
    """A running rag-sim server and its router's client."""

    router: TritonRouter
    server: LocalTriton


def _server(workdir: Path, slots: int | None) -> Iterator[Pod]:
    require_tritonserver()
    server: LocalTriton = rag_sim_triton(
        workdir, TIME_SCALE, FASTEST, router_instances=INSTANCES, pipeline_slots=slots
    ).start(workdir)
    client = TritonRouter(server.grpc_url, backoff_s=0.05)
    try:
        client.binding = _table()
        client.switch(FASTEST)
        yield Pod(client, server)
    finally:
        client.close()
        server.stop()


@pytest.fixture(scope="module")
def gated_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """rag-sim with a router of 8 instances and a gate of 1 slot, late binding on."""
    yield from _server(tmp_path_factory.mktemp("gated"), 1)


@pytest.fixture(scope="module")
def gated(gated_pod: Pod) -> TritonRouter:
    """The gated pod's router."""
    return gated_pod.router


@pytest.fixture(scope="module")
def ungated_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """The same router without the gate."""
    yield from _server(tmp_path_factory.mktemp("ungated"), None)


@pytest.fixture(scope="module")
def ungated(ungated_pod: Pod) -> TritonRouter:
    """The ungated pod's router."""
    return ungated_pod.router


@dataclass(frozen=True)
class Served:
    """One request of the burst: when it was sent and answered (monotonic s), and its reply."""

    sent: float
    answered: float
    reply: RouterReply

    @property
    def pipeline_s(self) -> float:
        """How long it was in the pipeline: its component calls, in s."""
        assert self.reply.component_ms is not None
        return sum(self.reply.component_ms.values()) / 1000


def _send(router: TritonRouter, index: int) -> Served:
    """Request ``index`` of a burst, sent ``index`` x SEND_GAP_S from now with DEADLINE_S left."""
    time.sleep(index * SEND_GAP_S)
    sent = time.monotonic()
    reply = router.infer(
        {"sample": index},
        deadline_ns=time.time_ns() + round(DEADLINE_S * 1e9),
        component_times=True,
    )
    return Served(sent, time.monotonic(), reply)


def _burst(router: TritonRouter) -> list[Served]:
    """A request that occupies the pipeline (ACCURATE, overridden), then BURST requests with
    DEADLINE_S left sent SEND_GAP_S apart behind it; the burst's requests in sending order."""
    with ThreadPoolExecutor(max_workers=BURST + 1) as pool:
        blocker = pool.submit(router.infer, {"sample": 99}, ACCURATE)
        time.sleep(SEND_GAP_S)
        burst = list(pool.map(partial(_send, router), range(1, BURST + 1)))
        blocker.result()
    return burst


def _serial_shortfall_s(burst: list[Served]) -> float:
    """How much shorter the burst's span (from the first request's entry into the pipeline to
    the last answer) is than the sum of its requests' times in the pipeline: about 0 or less
    when they ran one at a time (the sum leaves out the calls' own overhead), the overlap
    when they shared the pipeline. Answers are timed by the client, off by a few ms each."""
    first = min(burst, key=lambda s: s.answered)
    span = max(s.answered for s in burst) - (first.answered - first.pipeline_s)
    return sum(s.pipeline_s for s in burst) - span


def test_a_burst_runs_one_at_a_time_in_arrival_order_and_its_head_binds_for_its_followers(
    gated: TritonRouter,
) -> None:
    # Alone, a request with DEADLINE_S left binds ACCURATE.
    alone = gated.infer({"sample": 0}, deadline_ns=time.time_ns() + round(DEADLINE_S * 1e9))
    assert alone.config == config_key(ACCURATE)
    try:
        gated.binding = {**_table(), "slo_ms": DEADLINE_S * 1000}
        gated.switch(FASTEST)
        burst = _burst(gated)
    finally:
        gated.binding = _table()
        gated.switch(FASTEST)
    assert _serial_shortfall_s(burst) < SLACK_S, [(s.answered, s.pipeline_s) for s in burst]
    # Answered in the order sent: the gate is FIFO across the instances' processes.
    assert sorted(burst, key=lambda s: s.answered) == burst
    # The head saw BURST - 1 requests with 12 s left waiting behind it: FASTEST; the last
    # saw none: ACCURATE.
    assert burst[0].reply.config == config_key(FASTEST)
    assert burst[-1].reply.config == config_key(ACCURATE)


def test_without_the_gate_the_same_burst_shares_the_pipeline_and_its_head_binds_alone(
    ungated: TritonRouter,
) -> None:
    burst = _burst(ungated)
    # Several at once: their times in the pipeline add up to far more than the burst's span.
    assert _serial_shortfall_s(burst) > 5 * SLACK_S
    assert burst[0].reply.config == config_key(ACCURATE)


def test_behind_the_gate_the_router_polls_nothing_without_it_one_instance_polls(
    gated_pod: Pod, ungated_pod: Pod
) -> None:
    """Behind the gate the followers are the waiters at it: no poller of Triton's queue starts
    (live it held each request's turn in the pipeline ~4 ms longer on 2 cores). Without the
    gate the first bound request starts the pod's poller, whose lock file says so."""
    for pod in (gated_pod, ungated_pod):
        reply = pod.router.infer(
            {"sample": 1}, deadline_ns=time.time_ns() + round(DEADLINE_S * 1e9)
        )
        assert reply.config == config_key(ACCURATE)
    gated_lock = gated_pod.server.router_file("inflight.bin.poller")
    ungated_lock = ungated_pod.server.router_file("inflight.bin.poller")
    assert gated_lock is not None
    assert ungated_lock is not None
    assert ungated_lock.exists()
    assert not gated_lock.exists()


def test_behind_the_gate_a_request_without_a_deadline_binds_by_the_tables_slo(
    gated: TritonRouter, ungated: TritonRouter
) -> None:
    # The table's SLO (60 s) from take-up is its deadline: ACCURATE fits, while the router's
    # active configuration is FASTEST. Without the gate it is served as routed.
    assert gated.infer({"sample": 0}).config == config_key(ACCURATE)
    assert ungated.infer({"sample": 0}).config == config_key(FASTEST)
    # An override still rules.
    assert gated.infer({"sample": 0}, config=FASTEST).config == config_key(FASTEST)


def test_behind_the_gate_the_lag_cap_binds_from_static_fastests_shared_schedule(
    gated: TritonRouter,
) -> None:
    # Alone on an idle pod a request is on static fastest's schedule: its extra time over the
    # fastest completion (ACCURATE's 9 s more) may leave it lag_share x 60 s behind that. Its
    # deadline is the table's SLO from now (the router takes its arrival from it).
    try:
        for share, expected in ((0.1, FASTEST), (0.2, ACCURATE)):
            gated.binding = {**_table(), "lag_share": share, "lag_reserve": 0}
            gated.switch(FASTEST)
            reply = gated.infer({"sample": 0}, deadline_ns=time.time_ns() + 60 * 10**9)
            assert reply.config == config_key(expected), share
    finally:
        gated.binding = _table()
        gated.switch(FASTEST)


def test_behind_the_gate_a_workflow_switch_applies_to_the_requests_waiting_at_it(
    gated: TritonRouter,
) -> None:
    """Whole-workflow serving (no binding table): a request already taken up and waiting at the
    gate when the workflow switches is served on the new configuration, as one still queued in
    Triton would be (the simulator's rule), not on the one active when it was taken up."""
    try:
        gated.binding = None
        gated.switch(ACCURATE)
        with ThreadPoolExecutor(max_workers=2) as pool:
            # ACCURATE at its slowest holds the pipeline for several hundred ms.
            blocker = pool.submit(gated.infer, {"sample": 99, "quantile": 0.999}, ACCURATE)
            time.sleep(SEND_GAP_S)
            waiter = pool.submit(gated.infer, {"sample": 1})
            time.sleep(5 * SEND_GAP_S)
            gated.switch(FASTEST)
            assert not blocker.done(), "the blocker ended before the switch: nothing waited"
            assert waiter.result().config == config_key(FASTEST)
            assert blocker.result().config == config_key(ACCURATE)
    finally:
        gated.binding = _table()
        gated.switch(FASTEST)


def _lead(router: TritonRouter) -> list[Served]:
    """BURST requests with DEADLINE_S left sent SEND_GAP_S apart to an idle pod, the first at
    a free pipeline; in sending order."""
    with ThreadPoolExecutor(max_workers=BURST) as pool:
        return list(pool.map(partial(_send, router), range(BURST)))


def test_behind_the_gate_the_first_at_a_free_pipeline_settles_and_binds_for_its_burst(
    gated: TritonRouter,
) -> None:
    # Without a settle, the first of a burst finds the pipeline free and binds before the
    # rest (SEND_GAP_S apart) reach the gate: alone, ACCURATE.
    assert _lead(gated)[0].reply.config == config_key(ACCURATE)
    # Long enough for all but the last of the burst to reach the gate (the table's bound is
    # 100 ms).
    settle_s = (BURST - 1.5) * SEND_GAP_S
    try:
        gated.binding = {**_table(), "settle_ms": settle_s * 1000, "slo_ms": DEADLINE_S * 1000}
        gated.switch(FASTEST)
        burst = _lead(gated)
    finally:
        gated.binding = _table()
        gated.switch(FASTEST)
    # It waited the settle before it entered the pipeline, and by then the rest of the burst
    # waited at the gate behind it: FASTEST, for them.
    head = burst[0]
    assert head.answered - head.sent >= settle_s + head.pipeline_s - SLACK_S
    assert head.reply.config == config_key(FASTEST)
    assert burst[-1].reply.config == config_key(ACCURATE)


def _depths_while_the_gate_holds_a_burst(pod: Pod, depth: QueueDepthSource) -> list[float]:
    """The queue ``depth`` reads, every 10 ms, while a request that occupies the pipeline
    (ACCURATE, 130-330 ms at this scale) holds BURST requests at the gate behind it."""
    seen: list[float] = []
    with ThreadPoolExecutor(max_workers=BURST + 1) as pool:
        blocker = pool.submit(pod.router.infer, {"sample": 99}, ACCURATE)
        time.sleep(SEND_GAP_S)
        burst = [pool.submit(pod.router.infer, {"sample": i}, FASTEST) for i in range(BURST)]
        while not all(request.done() for request in burst):
            seen.append(depth.read().queue_depth)
            time.sleep(0.01)
        blocker.result()
    return seen


def test_the_operators_queue_reading_counts_the_requests_waiting_at_the_gate(
    gated_pod: Pod,
) -> None:
    # Behind the gate the router's instances take the burst up at once, so Triton's own pending
    # count stays near 0; the instances' gauge gives the waiters back to the operator's reading.
    depth = TritonQueueDepth(gated_pod.server.metrics_url)
    assert depth.read().queue_depth == 0
    seen = _depths_while_the_gate_holds_a_burst(gated_pod, depth)
    assert max(seen) == BURST, seen
    assert depth.read().queue_depth == 0


def test_prometheus_default_query_counts_the_requests_waiting_at_the_gate(
    gated_pod: Pod, tmp_path: Path
) -> None:
    require_prometheus()
    prometheus = LocalPrometheus(
        targets=[f"127.0.0.1:{gated_pod.server.metrics_port}"], interval_s=0.1
    )
    prometheus.start(tmp_path)
    try:
        depth = PrometheusQueueDepth(prometheus.url)
        wait_for(lambda: depth_or_none(depth) == 0, 10, "Prometheus's first scrape")
        seen = _depths_while_the_gate_holds_a_burst(gated_pod, depth)
        # The burst drains over about a second: scrapes every 0.1 s see most of it waiting.
        assert max(seen) >= BURST - 2, seen
    finally:
        prometheus.stop()


def test_behind_the_gate_admission_judges_a_request_without_a_deadline_by_the_tables_slo(
    gated: TritonRouter, ungated: TritonRouter
) -> None:
    # Admission alone (no binding table): ACCURATE's 10 s cannot fit the table's 1 s SLO from
    # take-up, FASTEST's 0 ms can. Behind the gate that deadline is the request's own; without
    # the gate a request without a deadline is served as routed.
    admission = {
        "quantiles_ms": {config_key(ACCURATE): 10_000.0, config_key(FASTEST): 0.0},
        "fastest": config_key(FASTEST),
        "slo_ms": 1_000.0,
    }
    for router in (gated, ungated):
        router.binding = None
        router.admission = admission
        router.switch(ACCURATE)
    try:
        assert gated.infer({"sample": 0}).config == config_key(FASTEST)
        assert ungated.infer({"sample": 0}).config == config_key(ACCURATE)
        # An override still rules.
        assert gated.infer({"sample": 0}, config=ACCURATE).config == config_key(ACCURATE)
    finally:
        for router in (gated, ungated):
            router.admission = None
            router.binding = _table()
            router.switch(FASTEST)


def test_the_images_gated_config_puts_the_router_behind_its_gate(tmp_path: Path) -> None:
    """examples/rag-sim-triton.yaml runs the image with --model-config-name=gated
    (model-images/rag-sim/models/router/configs/gated.pbtxt): the router then has 8 instances
    behind a gate of 1, each on the gate's gauge; without the flag, one instance and no gate."""
    require_tritonserver()
    repository = assemble_repository(
        "rag-sim", tmp_path / "models", {c: {"time_scale": "0"} for c in COMPONENTS}
    )
    for flags, instances, gauges in (((f"--model-config-name={GATED}",), 8, 8), ((), 1, 0)):
        server = LocalTriton(repository=repository, extra_args=flags).start(tmp_path)
        try:
            router = TritonRouter(server.grpc_url)
            config = router.model_config()
            router.close()
            assert router_instances(config) == instances
            slots = config.get("parameters", {}).get(PIPELINE_SLOTS_PARAMETER, {})
            assert slots.get("string_value") == ("1" if gauges else None)
            with urllib.request.urlopen(server.metrics_url, timeout=5) as page:
                text = page.read().decode()
            assert text.count(f'{GATE_WAITING_METRIC}{{instance="') == gauges, text[-2000:]
        finally:
            server.stop()


def test_the_control_model_reports_the_gate_and_the_tables_it_holds(
    gated: TritonRouter, ungated: TritonRouter
) -> None:
    """What the operator's PerRequestBinding condition and its skipped holds read: each router
    reports its gate (none without one) and the digest of the tables last set."""
    held = gated.serving()
    assert (held.binds, held.gate) == (True, (INSTANCES, 1))
    assert held.tables == tables_digest(None, _table())
    bare = ungated.serving()
    assert (bare.binds, bare.gate) == (True, None)
    # A switch with other tables: the digest follows.
    ungated.admission = None
    ungated.binding = {**_table(), "slo_ms": 50_000.0}
    try:
        ungated.switch(FASTEST)
        assert ungated.serving().tables == tables_digest(None, ungated.binding)
    finally:
        ungated.binding = _table()
        ungated.switch(FASTEST)
