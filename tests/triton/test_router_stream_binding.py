"""Per-request binding behind the router's gate, through a streaming router on a real Triton:
rag-sim's streaming variant with its router gated (4 instances, 1 slot) and a binding table, so
each request is bound as it is taken up, streams its tokens, and holds the gate's one slot until
its stream ends or its client goes away."""

from __future__ import annotations

import itertools
import queue
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from ragsim import ACCURATE, FASTEST, scores_of

from compass.dataplane.triton import RouterReply, TritonRouter
from compass.domain.binding import RAG_SIM_STAGE_PARAMS
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton
from compass_dev.scenarios import (
    STREAM_GENERATOR,
    STREAM_ROUTER_MODEL,
    rag_sim_data,
    rag_sim_stream_triton,
)
from compass_rules.protocol import STREAM_KEY
from tiers import require_tritonserver

# rag-sim at twice its recorded latencies: ACCURATE's generator streams for ~0.5 s, long beside
# Triton's per-request overhead on a busy machine.
TIME_SCALE = 2.0
TOKENS = 16
PREFILL_SHARE = 0.25
GENERATOR_SHARE = 0.7
# Per the table ACCURATE takes 10 s, FASTEST 1 s: a request with the SLO's 60 s left (no
# deadline sent: behind the gate its take-up + the SLO) binds ACCURATE, one with 2 s FASTEST.
SLO_MS = 60_000.0
SHORT_DEADLINE_S = 2.0


def _table() -> dict[str, Any]:
    return {
        "stages": [list(names) for names in RAG_SIM_STAGE_PARAMS],
        "components": ["retriever", "reranker", STREAM_GENERATOR],
        "configs": [
            {"config": config_key(FASTEST), "accuracy": 0.80, "stage_ms": [0.0, 0.0, 1_000.0]},
            {"config": config_key(ACCURATE), "accuracy": 0.86, "stage_ms": [0.0, 0.0, 10_000.0]},
        ],
        "slo_ms": SLO_MS,
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """The streaming variant, its router gated; two generator instances, so a request's wait
    for the generator never hides how long it waited at the gate."""
    require_tritonserver()
    workdir = tmp_path_factory.mktemp("triton-stream-gate")
    triton = rag_sim_stream_triton(
        workdir,
        TIME_SCALE,
        FASTEST,
        pipeline_slots=1,
        instances={STREAM_ROUTER_MODEL: 4, STREAM_GENERATOR: 2},
    ).start(workdir)
    try:
        yield triton
    finally:
        triton.stop()


@pytest.fixture(scope="module")
def router(server: LocalTriton) -> Iterator[TritonRouter]:
    """The gated streaming router's client, per-request binding on."""
    client = TritonRouter(server.grpc_url, model=STREAM_ROUTER_MODEL, backoff_s=0.05)
    try:
        client.binding = _table()
        client.switch(FASTEST)
        assert client.decoupled()
        for config in (FASTEST, ACCURATE):  # each model's first (cold) request
            client.infer({"sample": 0, "quantile": 0.5}, config=config)
        yield client
    finally:
        client.close()


def generator_ms(config: dict[str, object]) -> float:
    """The streaming generator's whole time at the median, ms."""
    entry = rag_sim_data()["configs"][config_key(config)]
    total = float(np.interp(0.5, rag_sim_data()["quantile_grid"], entry["latency_quantiles_ms"]))
    return GENERATOR_SHARE * total * TIME_SCALE


def _served(reply: RouterReply, config: dict[str, object], sample: int) -> None:
    """The reply streamed every token and was served by ``config`` (its score too)."""
    assert reply.config == config_key(config)
    assert [chunk[STREAM_KEY] for chunk in reply.streamed] == [STREAM_GENERATOR] * TOKENS
    assert reply.result["score"] == pytest.approx(scores_of(rag_sim_data(), config)[sample])


def test_each_request_streams_on_the_configuration_its_binding_chose(router: TritonRouter) -> None:
    # No deadline sent: the SLO's 60 s left fit ACCURATE, though FASTEST is the active one.
    _served(router.infer({"sample": 1, "quantile": 0.5}), ACCURATE, 1)
    short = time.time_ns() + round(SHORT_DEADLINE_S * 1e9)
    _served(router.infer({"sample": 2, "quantile": 0.5}, deadline_ns=short), FASTEST, 2)


def test_the_gate_holds_its_slot_until_each_stream_ends(router: TritonRouter) -> None:
    def timed(sample: int) -> tuple[float, float, RouterReply]:
        sent = time.perf_counter()
        reply = router.infer({"sample": sample, "quantile": 0.5})
        assert reply.first_response_s is not None
        return sent + reply.first_response_s, sent + reply.latency_s, reply

    with ThreadPoolExecutor(max_workers=3) as pool:
        streams = sorted(pool.map(timed, range(3)), key=lambda item: item[0])
    for _, _, reply in streams:
        _served(reply, ACCURATE, int(reply.result["sample"]))
    # One slot: a stream's first token only after the stream before it ended; a pipeline run
    # starts with its retriever and reranker, so not even the previous one's last token.
    for (_, ended, _), (first, _, _) in itertools.pairwise(streams):
        assert first > ended - 0.005


def _metric(server: LocalTriton, name: str) -> float:
    """The router's series of ``name``, summed over its instances and labels."""
    with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{STREAM_ROUTER_MODEL}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_client_gone_mid_stream_gives_the_slot_back_at_once(
    router: TritonRouter, server: LocalTriton
) -> None:
    served_before = _metric(server, "compass_router_served_total")
    replies: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: replies.put((result, error)))
        request = grpcclient.InferInput("REQUEST", [1], "BYTES")
        request.set_data_from_numpy(np.array([b'{"sample": 3, "quantile": 0.5}'], dtype=object))
        client.async_stream_infer(STREAM_ROUTER_MODEL, [request])
        _, error = replies.get(timeout=30)  # its first token: it holds the slot, bound ACCURATE
        assert error is None
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    # The next request starts as soon as the router sees the client gone (its next token), not
    # when the abandoned request's generator would have finished.
    reply = router.infer({"sample": 4, "quantile": 0.5})
    _served(reply, ACCURATE, 4)
    whole_s = generator_ms(ACCURATE) / GENERATOR_SHARE / 1000
    remaining_s = (1 - PREFILL_SHARE) * generator_ms(ACCURATE) / 1000
    assert reply.latency_s < whole_s + 0.5 * remaining_s
    # The abandoned request is not counted as served; the one after it is.
    assert _metric(server, "compass_router_served_total") == served_before + 1
