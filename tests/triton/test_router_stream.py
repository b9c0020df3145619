"""A decoupled (streaming) stage through the router on a real Triton: rag-sim's streaming variant
(model-images/rag-sim/streaming), its generator's tokens streamed through a decoupled router to
a gRPC streaming client, with time to first token and end to end measured, profiled, switched."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ragsim import ACCURATE, FASTEST, scores_of

from compass.dataplane.metrics import PrometheusQueueDepth, TritonQueueDepth
from compass.dataplane.profiler import ProfileSettings, profile_configuration
from compass.dataplane.triton import TritonRouter
from compass.domain.profiles import parse_profile
from compass.domain.search import SearchSettings, search
from compass.domain.space import Space, config_key
from compass.evaluators.triton import TritonEvaluator
from compass_dev.local_triton import LocalPrometheus, LocalTriton
from compass_dev.processes import wait_for
from compass_dev.scenarios import (
    STREAM_GENERATOR,
    STREAM_ROUTER_MODEL,
    rag_sim_data,
    rag_sim_stream_triton,
)
from compass_rules.protocol import (
    STREAM_END_METRIC,
    STREAM_FIRST_METRIC,
    STREAM_KEY,
    STREAMS_METRIC,
)
from tiers import require_prometheus, require_tritonserver

# Slower than the tier's other rag-sim servers: the generator's ~16 tokens then come several ms
# apart, far beyond Triton's per-response overhead, so the stream's shape is measurable.
TIME_SCALE = 0.5
TOKENS = 16
PREFILL_SHARE = 0.25
GENERATOR_SHARE = 0.7
# A second streaming router whose pipeline calls a streaming drafter (the generator's model
# under another name, fewer tokens, a smaller share) before the generator: only the last
# stage's tokens reach its client.
DRAFTER = "drafter_stream"
DRAFT_ROUTER = "router_draft"
DRAFT_TOKENS = 4
DRAFTER_SHARE = 0.2
DRAFT_PIPELINE = """
import json

import numpy as np


def run(request, config, call):
    inputs = {
        "CONFIG": np.array([json.dumps(config, sort_keys=True).encode()], dtype=np.object_),
        "SAMPLE": np.array([int(request["sample"])], dtype=np.int64),
        "QUANTILE": np.array([float(request["quantile"])], dtype=np.float32),
    }
    draft = call("drafter_stream", inputs, ["TOKEN"])["TOKEN"]
    answer = call("generator_stream", inputs, ["TOKEN"])["TOKEN"]
    return {"draft": b"".join(draft).decode(), "text": b"".join(answer).decode()}
"""


def _renamed(repository: Path, source: str, name: str, replace: dict[str, str]) -> None:
    """A copy of model ``source`` named ``name``, its config's texts replaced as given."""
    shutil.copytree(repository / source, repository / name)
    config = repository / name / "config.pbtxt"
    text = config.read_text(encoding="utf-8")
    for old, new in {f'name: "{source}"': f'name: "{name}"', **replace}.items():
        assert old in text, f"{source}'s config lacks {old}"
        text = text.replace(old, new)
    config.write_text(text, encoding="utf-8")


def _add_draft_router(repository: Path) -> tuple[str, ...]:
    """DRAFTER and DRAFT_ROUTER (and its control model) beside the variant's; their names."""
    _renamed(
        repository,
        STREAM_GENERATOR,
        DRAFTER,
        {
            'key: "tokens" value: { string_value: "16" }': (
                f'key: "tokens" value: {{ string_value: "{DRAFT_TOKENS}" }}'
            ),
            'key: "share" value: { string_value: "0.7" }': (
                f'key: "share" value: {{ string_value: "{DRAFTER_SHARE}" }}'
            ),
        },
    )
    # Listed in pipeline order: the drafter's stream is joined, the generator's forwarded.
    _renamed(
        repository,
        STREAM_ROUTER_MODEL,
        DRAFT_ROUTER,
        {'string_value: "generator_stream"': f'string_value: "{DRAFTER},{STREAM_GENERATOR}"'},
    )
    (repository / DRAFT_ROUTER / "1" / "pipeline.py").write_text(DRAFT_PIPELINE, encoding="utf-8")
    _renamed(
        repository,
        f"{STREAM_ROUTER_MODEL}_control",
        f"{DRAFT_ROUTER}_control",
        {f'string_value: "{STREAM_ROUTER_MODEL}"': f'string_value: "{DRAFT_ROUTER}"'},
    )
    return DRAFTER, DRAFT_ROUTER, f"{DRAFT_ROUTER}_control"


@pytest.fixture(scope="module")
def streaming(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """tritonserver with rag-sim's streaming variant, FASTEST active, and DRAFT_ROUTER."""
    require_tritonserver()
    workdir = tmp_path_factory.mktemp("triton-stream")
    server = rag_sim_stream_triton(workdir, TIME_SCALE, FASTEST)
    extra = _add_draft_router(server.repository)
    server = dataclasses.replace(server, models=(*server.models, *extra)).start(workdir)
    try:
        # Each model's first request runs cold (its stub's imports): not what is measured.
        warm = TritonRouter(server.grpc_url, model=STREAM_ROUTER_MODEL)
        warm.infer({"sample": 0})
        warm.close()
        yield server
    finally:
        server.stop()


@pytest.fixture
def router(streaming: LocalTriton) -> Iterator[TritonRouter]:
    """A client of the streaming router; FASTEST active again afterwards."""
    client = TritonRouter(streaming.grpc_url, model=STREAM_ROUTER_MODEL, backoff_s=0.05)
    yield client
    client.switch(FASTEST)
    client.close()


def generator_ms(config: dict[str, object], quantile: float) -> float:
    """The streaming generator's whole time for a request at this latency quantile, ms."""
    entry = rag_sim_data()["configs"][config_key(config)]
    grid = rag_sim_data()["quantile_grid"]
    total = float(np.interp(quantile, grid, entry["latency_quantiles_ms"]))
    return GENERATOR_SHARE * total * TIME_SCALE


def test_tokens_stream_through_the_router_with_first_token_and_end_to_end_times(
    router: TritonRouter,
) -> None:
    assert router.decoupled()
    scores = scores_of(rag_sim_data(), FASTEST)
    for sample in range(3):
        reply = router.infer({"sample": sample, "quantile": 0.5})
        # Every token, in order, as the generator streamed it, then the pipeline's answer.
        assert [chunk[STREAM_KEY] for chunk in reply.streamed] == [STREAM_GENERATOR] * TOKENS
        tokens = [chunk["outputs"]["TOKEN"] for chunk in reply.streamed]
        assert tokens == [[f"t{i} "] for i in range(TOKENS)]
        assert reply.result["text"] == "".join(t[0] for t in tokens)
        assert reply.result["score"] == pytest.approx(scores[sample])
        assert reply.config == config_key(FASTEST)
        # The first token comes after the stages before the generator and its prefill; the
        # rest of its time (the decoding) lies between the first token and the end.
        generator = generator_ms(FASTEST, 0.5)
        assert reply.first_response_s is not None
        first_ms, end_ms = reply.first_response_s * 1000, reply.latency_s * 1000
        assert first_ms >= PREFILL_SHARE * generator
        # Half of it at least: a busy client sees the first token late, and the end no longer
        # includes the stream's close; tokens sent all at once would leave about none.
        assert end_ms - first_ms >= 0.5 * (1 - PREFILL_SHARE) * generator


def test_the_router_exports_its_streams_first_response_and_end_times(
    router: TritonRouter, streaming: LocalTriton
) -> None:
    for sample in range(4):
        router.infer({"sample": sample, "quantile": 0.5})
    with urllib.request.urlopen(streaming.metrics_url, timeout=5) as response:
        text = response.read().decode()

    def value(metric: str) -> float:
        series = rf'^{metric}\{{[^}}]*model="{STREAM_ROUTER_MODEL}"[^}}]*\}} (\S+)$'
        found = re.search(series, text, re.M)
        assert found, f"{metric} not exported"
        return float(found.group(1))

    streams = value(STREAMS_METRIC)
    first = value(STREAM_FIRST_METRIC)
    end = value(STREAM_END_METRIC)
    assert streams >= 4
    # Mean time to first token and mean end to end, as a dashboard divides them.
    assert 0 < first / streams < end / streams
    assert end / streams >= generator_ms(FASTEST, 0.5) / 1000


def _client_means(router: TritonRouter, count: int) -> tuple[float, float]:
    """Serve ``count`` streams; the client's mean time to the first token and to the end, s."""
    firsts, ends = [], []
    for sample in range(count):
        reply = router.infer({"sample": sample, "quantile": 0.5})
        assert reply.first_response_s is not None
        firsts.append(reply.first_response_s)
        ends.append(reply.latency_s)
    return float(np.mean(firsts)), float(np.mean(ends))


def _within_what_the_client_measured(
    ttft_s: float | None, stream_s: float | None, client: tuple[float, float]
) -> None:
    """The router's times (from take-up) are the client's less the trip to the server and
    back: a little shorter, never longer, and past the generator's prefill."""
    first, end = client
    assert ttft_s is not None
    assert stream_s is not None
    assert PREFILL_SHARE * generator_ms(FASTEST, 0.5) / 1000 <= ttft_s <= first
    assert ttft_s >= 0.5 * first
    assert ttft_s < stream_s <= end
    assert stream_s >= 0.5 * end


def test_the_operator_reads_the_mean_time_to_first_token_the_client_saw(
    router: TritonRouter, streaming: LocalTriton
) -> None:
    """status.served's stream times, as the operator's direct scrape of the pod reads them:
    over the window between two readings, only the streams served within it."""
    scrape = TritonQueueDepth(streaming.metrics_url, STREAM_ROUTER_MODEL)
    _client_means(router, 2)  # streams before the window: not counted
    scrape.read()
    client = _client_means(router, 6)
    scrape.read()
    window = scrape.served(60.0)
    assert window is not None
    assert window.streams is not None
    assert window.streams.streams == 6
    assert window.configs == {config_key(FASTEST): 6}
    _within_what_the_client_measured(window.streams.mean_first_s, window.streams.mean_end_s, client)


def test_prometheus_reads_the_mean_time_to_first_token(
    router: TritonRouter, streaming: LocalTriton, tmp_path: Path
) -> None:
    require_prometheus()
    prometheus = LocalPrometheus(targets=[f"127.0.0.1:{streaming.metrics_port}"], interval_s=0.2)
    prometheus.start(tmp_path)
    try:
        source = PrometheusQueueDepth(prometheus.url, model=STREAM_ROUTER_MODEL)

        def scraped() -> bool:
            served = source.served(60.0)
            return served is not None and served.streams is not None

        wait_for(scraped, 10, "Prometheus's first scrapes of the stream counters")
        client = _client_means(router, 6)

        def counted() -> tuple[float, float] | None:
            served = source.served(60.0)
            times = None if served is None else served.streams
            # increase() extrapolates the counts, all three alike: their ratios are the means.
            if times is None or times.streams < 5.5:
                return None
            assert times.mean_first_s is not None
            assert times.mean_end_s is not None
            return times.mean_first_s, times.mean_end_s

        means = wait_for(counted, 10, "the streams in Prometheus")
        assert means is not None
        _within_what_the_client_measured(*means, client)
    finally:
        prometheus.stop()


def test_profiling_records_time_to_first_token_per_configuration(router: TritonRouter) -> None:
    settings = ProfileSettings(warmup_runs=1, measured_runs=6)
    entries = [
        profile_configuration(router, config, settings, lambda i: {"sample": i})
        for config in (FASTEST, ACCURATE)
    ]
    for entry in entries:
        assert 0 < entry["ttft_mean_ms"] < entry["latency_mean_ms"]
        assert entry["ttft_p50_ms"] <= entry["ttft_p95_ms"]
        assert entry["ttft_p95_ms"] <= entry["latency_p95_ms"]
        profile = parse_profile({**entry, "accuracy": 0.8}, "profiles[0]")
        assert profile.ttft_mean_ms == pytest.approx(entry["ttft_mean_ms"])
    # The more accurate configuration's generator takes longer, so does its first token.
    assert entries[1]["ttft_mean_ms"] > entries[0]["ttft_mean_ms"]


def test_a_switch_moves_the_streaming_router_and_its_streams_keep_coming(
    router: TritonRouter,
) -> None:
    report = router.switch(ACCURATE)
    assert report.config == config_key(ACCURATE)
    reply = router.infer({"sample": 1})
    assert reply.config == config_key(ACCURATE)
    assert len(reply.streamed) == TOKENS
    assert reply.result["score"] == pytest.approx(scores_of(rag_sim_data(), ACCURATE)[1])


def test_only_the_last_streaming_stage_reaches_the_client(streaming: LocalTriton) -> None:
    client = TritonRouter(streaming.grpc_url, model=DRAFT_ROUTER, backoff_s=0.05)
    try:
        client.infer({"sample": 0, "quantile": 0.5})  # its models' first (cold) calls
        reply = client.infer({"sample": 1, "quantile": 0.5})
    finally:
        client.close()
    # The drafter streamed too, but its pieces went to the pipeline, joined, not to the client.
    assert [chunk[STREAM_KEY] for chunk in reply.streamed] == [STREAM_GENERATOR] * TOKENS
    assert reply.result["draft"] == "".join(f"t{i} " for i in range(DRAFT_TOKENS))
    assert reply.result["text"] == "".join(f"t{i} " for i in range(TOKENS))
    # The first token the client sees comes after the whole draft and the generator's prefill.
    drafter = generator_ms(FASTEST, 0.5) * DRAFTER_SHARE / GENERATOR_SHARE
    assert reply.first_response_s is not None
    assert reply.first_response_s * 1000 >= drafter + PREFILL_SHARE * generator_ms(FASTEST, 0.5)


class _RecordedScores:
    """rag-sim's recorded scores: what the streaming router's answers must reproduce."""

    def evaluate(self, config: dict[str, object], sample_indices: list[int]) -> list[float]:
        return [scores_of(rag_sim_data(), config)[i] for i in sample_indices]


def test_a_search_through_the_streaming_router_finds_what_the_recorded_scores_give(
    router: TritonRouter,
) -> None:
    space = Space.from_spec(
        {
            "parameters": [
                {"name": "generator_model", "values": ["gemma3:12b", "llama3.2:3b"]},
                {"name": "retriever_k", "type": "integer", "values": [20]},
                {"name": "reranker_k", "type": "integer", "values": [1]},
                {"name": "reranker_model", "values": ["ms-marco"]},
            ]
        }
    )
    settings = SearchSettings(tau=0.8)
    live = search(space, TritonEvaluator(lambda: router), 24, settings)
    expected = search(space, _RecordedScores(), 24, settings)  # type: ignore[arg-type]
    assert live.sample_evals == expected.sample_evals > 0
    assert [a.accuracy for a in live.assessments] == pytest.approx(
        [a.accuracy for a in expected.assessments]
    )
    assert [a.index for a in live.feasible] == [a.index for a in expected.feasible]


def test_the_variant_serves_only_its_own_models(streaming: LocalTriton) -> None:
    # rag-sim's own router and generator stay unloaded: the variant is served on its own.
    index = json.loads(
        urllib.request.urlopen(
            urllib.request.Request(f"http://{streaming.http_url}/v2/repository/index", b"{}"),
            timeout=5,
        ).read()
    )
    ready = {m["name"] for m in index if m.get("state") == "READY"}
    assert STREAM_ROUTER_MODEL in ready
    assert STREAM_GENERATOR in ready
    assert "router" not in ready
    assert "generator" not in ready
    assert Path(streaming.repository, STREAM_ROUTER_MODEL, "1", "model.py").is_file()
