"""Streaming (decoupled) stages outside Triton: the router's list of decoupled components, the
profile's time to first token, and how profiling summarises it (the real stream:
tests/triton/test_router_stream.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_inputs import PROFILES
from pydantic import ValidationError

from compass.api.paretopolicy import FrontEntry, ParetoPolicySpec
from compass.commands.main import main
from compass.conversion import policy_plan, threshold_statuses
from compass.dataplane.profiler import first_response_statistics
from compass.domain.profiles import ProfileError, parse_profiles
from compass.domain.space import config_key
from compass_dev.router_module import router_part
from compass_dev.scenarios import (
    FASTEST,
    STREAM_GENERATOR,
    STREAM_ROUTER_MODEL,
    rag_sim_stream_triton,
    scaled_profile,
)

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
    assert scaled_profile(profile, 0.5).ttft_mean_ms == 20.0
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


def _with_first_tokens(entry: dict[str, Any]) -> dict[str, Any]:
    """A profile entry with the time to first token a streaming router would record."""
    mean = entry["latency_mean_ms"]
    return {**entry, "ttft_mean_ms": mean / 4, "ttft_p50_ms": mean / 5, "ttft_p95_ms": mean / 2}


def _plan(tmp_path: Path, profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """`compass plan` of these profiles: the policy's spec it wrote."""
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": profiles}), encoding="utf-8")
    output = tmp_path / "policy.json"
    profiles = str(tmp_path / "profiles.json")
    code = main(["plan", "--profiles", profiles, "--slo-ms", "1000", "--output", str(output)])
    assert code == 0
    spec: dict[str, Any] = json.loads(output.read_text(encoding="utf-8"))["spec"]
    return spec


def test_time_to_first_token_reaches_the_plan_the_policy_and_its_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _plan(tmp_path, [_with_first_tokens(entry) for entry in PROFILES])
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if line.lstrip().startswith("#"))
    assert "ttft ms" in header
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()]
    by_name = {entry["config"]["model"]: entry for entry in PROFILES}
    for row in rows:
        entry = by_name[row[-1].split("/")[0]]
        assert float(row[4]) == pytest.approx(entry["latency_mean_ms"] / 4, abs=0.05)
    for entry in spec["front"]:
        mean = entry["latencyMeanMs"]
        assert (entry["ttftMeanMs"], entry["ttftP50Ms"]) == pytest.approx((mean / 4, mean / 5))
    policy = ParetoPolicySpec.model_validate(spec)
    statuses = threshold_statuses(policy_plan(policy))
    assert [s.ttft_mean_ms for s in statuses] == pytest.approx(
        [e["ttftMeanMs"] for e in spec["front"]]
    )


def test_profiles_and_policies_without_first_tokens_plan_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _plan(tmp_path, PROFILES)
    assert "ttft" not in capsys.readouterr().out
    assert not any(key.startswith("ttft") for entry in spec["front"] for key in entry)
    statuses = threshold_statuses(policy_plan(ParetoPolicySpec.model_validate(spec)))
    assert all(s.ttft_mean_ms is None for s in statuses)
    assert all("ttftMeanMs" not in s.model_dump(by_alias=True, exclude_none=True) for s in statuses)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ttftMeanMs": 120.0}, "ttftMeanMs 120 is above latencyMeanMs 100: a first token"),
        ({"ttftP95Ms": 160.0}, "ttftP95Ms 160 is above latencyP95Ms 150"),
        ({"ttftP50Ms": 40.0, "ttftP95Ms": 30.0}, "ttftP95Ms 30 is below ttftP50Ms 40"),
        ({"ttftMeanMs": -1.0}, "ttftMeanMs"),
    ],
)
def test_a_front_entrys_first_token_times_are_checked(
    fields: dict[str, float], message: str
) -> None:
    entry = {
        "config": {"k": 1},
        "accuracy": 0.8,
        "latencyMeanMs": 100.0,
        "latencyP95Ms": 150.0,
        **fields,
    }
    with pytest.raises(ValidationError, match=re.escape(message)):
        FrontEntry.model_validate(entry)
