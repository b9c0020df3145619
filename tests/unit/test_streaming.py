"""Streaming (decoupled) stages outside Triton: the router's list of decoupled components, the
profile's time to first token, and how profiling summarises it (the real stream:
tests/triton/test_router_stream.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compass.dataplane.profiler import first_response_statistics
from compass.domain.profiles import ProfileError, parse_profiles
from compass.domain.space import config_key
from compass.lab.scenarios import (
    FASTEST,
    STREAM_GENERATOR,
    STREAM_ROUTER_MODEL,
    rag_sim_stream_triton,
)
from compass_dev.router_module import router_part

ENTRY = {
    "config": {"k": 1},
    "accuracy": 0.8,
    "latency_mean_ms": 100.0,
    "latency_p50_ms": 95.0,
    "latency_p95_ms": 150.0,
}


def test_the_router_reads_its_decoupled_components_and_names_a_bad_one() -> None:
    stream = router_part("stream")
    assert stream.decoupled_components("generator, vllm_llama") == {"generator", "vllm_llama"}
    assert stream.decoupled_components("") == frozenset()
    assert stream.decoupled_components(None) == frozenset()
    with pytest.raises(ValueError, match=r"compass_decoupled_components .*'gen erator' is not a"):
        stream.decoupled_components("retriever,gen erator")


def test_a_decoupled_router_streams_the_last_named_component_to_its_client() -> None:
    stream = router_part("stream")
    assert stream.client_stream("drafter, vllm_llama") == "vllm_llama"
    assert stream.client_stream("vllm_llama") == "vllm_llama"
    assert stream.client_stream("") is None
    with pytest.raises(ValueError, match=r"compass_decoupled_components"):
        stream.client_stream("drafter,gen erator")


def test_time_to_first_token_is_read_scaled_and_optional() -> None:
    (profile,) = parse_profiles(
        [{**ENTRY, "ttft_mean_ms": 40.0, "ttft_p50_ms": 38.0, "ttft_p95_ms": 60.0}]
    )
    assert (profile.ttft_mean_ms, profile.ttft_p50_ms, profile.ttft_p95_ms) == (40.0, 38.0, 60.0)
    assert profile.scaled(0.5).ttft_mean_ms == 20.0
    # A profile from before streaming (or of a workflow that does not stream) loads as it did.
    (old,) = parse_profiles([ENTRY])
    assert (old.ttft_mean_ms, old.ttft_p95_ms) == (None, None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ttft_mean_ms": 120.0}, "profiles\\[0\\].ttft_mean_ms: 120 is above latency_mean_ms"),
        ({"ttft_p95_ms": 151.0}, "ttft_p95_ms: 151 is above latency_p95_ms 150"),
        ({"ttft_p50_ms": 50.0, "ttft_p95_ms": 40.0}, "ttft_p95_ms: 40 is below ttft_p50_ms"),
        ({"ttft_mean_ms": "40"}, "ttft_mean_ms: '40' is not a number"),
    ],
)
def test_bad_first_token_times_name_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profiles([{**ENTRY, **fields}])


def test_profiling_summarises_first_responses_only_where_every_reply_streamed() -> None:
    stats = first_response_statistics([10.0, 20.0, 30.0, 40.0])
    assert stats["ttft_mean_ms"] == 25.0
    assert stats["ttft_p50_ms"] == 25.0
    assert 38.0 < stats["ttft_p95_ms"] <= 40.0
    assert first_response_statistics([10.0, None]) == {}
    assert first_response_statistics([]) == {}


def test_the_streaming_variant_assembles_beside_rag_sims_own_components(tmp_path: Path) -> None:
    server = rag_sim_stream_triton(tmp_path, 0.1, FASTEST)
    models = server.repository
    assert set(server.models) == {
        "retriever",
        "reranker",
        STREAM_GENERATOR,
        STREAM_ROUTER_MODEL,
        f"{STREAM_ROUTER_MODEL}_control",
    }
    # The generic router and its parts, with the variant's own pipeline beside them.
    for part in ("model.py", "pipeline.py", "compass_router/stream.py", "compass_rules"):
        assert (models / STREAM_ROUTER_MODEL / "1" / part).exists()
    assert (models / f"{STREAM_ROUTER_MODEL}_control" / "1" / "model.py").is_file()
    router = (models / STREAM_ROUTER_MODEL / "config.pbtxt").read_text()
    assert "decoupled: true" in router
    assert config_key(FASTEST).replace('"', '\\"') in router
    generator = (models / STREAM_GENERATOR / "config.pbtxt").read_text()
    assert "decoupled: true" in generator
    assert 'key: "time_scale" value: { string_value: "0.1" }' in generator
    # Its generator is its own streaming model, not rag-sim's component.
    assert "get_response_sender" in (models / STREAM_GENERATOR / "1" / "model.py").read_text()
