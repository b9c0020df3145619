"""`compass profile` against a real Triton: the profiles the planner reads, measured for real."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ragsim import ACCURATE, COMPONENTS, FASTEST, TIME_SCALE, rag_sim_server

from compass.commands.main import main
from compass.dataplane.profiler import ProfileSettings, profile_configurations
from compass.dataplane.triton import TritonRouter
from compass.domain.space import config_key
from compass.lab.local_triton import LocalTriton
from compass.lab.scenarios import PAPER_FRONT


def _expected_mean_ms(data: dict[str, object], config: dict[str, object]) -> float:
    configs = data["configs"]
    assert isinstance(configs, dict)
    # The grid's points are midpoints of equal-probability bins: the mean is their average.
    quantiles = np.asarray(configs[json.dumps(config, sort_keys=True)]["latency_quantiles_ms"])
    return float(np.mean(quantiles)) * TIME_SCALE


def test_profile_measures_each_feasible_configuration_without_moving_traffic(
    triton: LocalTriton,
    router: TritonRouter,
    rag_sim_data: dict[str, object],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = tmp_path / "result.json"
    result.write_text(
        json.dumps(
            {
                "feasible": [
                    {"config": ACCURATE, "accuracy": 0.86, "samples": 100},
                    {"config": FASTEST, "accuracy": 0.84, "samples": 100},
                ],
                "evaluated": [],
                "sample_evals": 200,
                "configs_evaluated": 2,
            }
        )
    )
    output = tmp_path / "profiles.json"
    code = main(
        [
            "profile",
            "--triton",
            triton.grpc_url,
            "--result",
            str(result),
            "--warmup",
            "2",
            "--runs",
            "40",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    document = json.loads(output.read_text())
    profiles = {config_key(p["config"]): p for p in document["profiles"]}
    assert set(profiles) == {config_key(ACCURATE), config_key(FASTEST)}
    for config, accuracy in ((ACCURATE, 0.86), (FASTEST, 0.84)):
        entry = profiles[config_key(config)]
        assert entry["accuracy"] == accuracy
        assert entry["measurement_runs"] == 40
        assert entry["warmup_runs"] == 2
        assert 0 < entry["latency_p50_ms"] <= entry["latency_p95_ms"] <= entry["latency_p99_ms"]
        assert entry["latency_std_ms"] > 0
        # The measured service time is rag-sim's calibrated one plus a few ms of gRPC and BLS.
        expected = _expected_mean_ms(rag_sim_data, config)
        assert expected * 0.85 <= entry["latency_mean_ms"] <= expected + 15
        # Each component model's mean time, as the router timed its calls: parts of the whole.
        assert set(entry["component_ms"]) == set(COMPONENTS)
        assert 0 < sum(entry["component_ms"].values()) <= entry["latency_mean_ms"]
    assert (
        profiles[config_key(ACCURATE)]["latency_mean_ms"]
        > profiles[config_key(FASTEST)]["latency_mean_ms"]
    )
    # Profiling used per-request overrides: production stayed on FASTEST throughout.
    assert router.active_config() == config_key(FASTEST)


def test_profile_of_a_result_without_feasible_configurations_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"feasible": [], "evaluated": []}))
    code = main(
        ["profile", "--triton", "127.0.0.1:1", "--result", str(result), "--output", "x.json"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--result" in err
    assert "no feasible configuration" in err


def test_screening_measures_only_what_can_be_on_the_front(
    triton: LocalTriton, router: TritonRouter
) -> None:
    """A configuration that a more accurate one beats clearly keeps its screening profile."""
    # ACCURATE is ~2x slower than FASTEST; told it is also less accurate, it cannot be on the
    # front, so it is timed only by the screening pass. A near tie (FASTEST against itself
    # under another claimed accuracy) is never screened out: the margin protects it.
    configs = [(FASTEST, 0.9), (ACCURATE, 0.8), (dict(FASTEST), 0.85)]
    settings = ProfileSettings(warmup_runs=1, measured_runs=12, screen_runs=4)
    seen: list[tuple[int, int]] = []
    document = profile_configurations(
        router, configs, settings, lambda i: {"sample": i % 100}, lambda d, t: seen.append((d, t))
    )
    runs = [p["measurement_runs"] for p in document["profiles"]]
    assert runs == [12, 4, 12]
    assert [p.get("screened", False) for p in document["profiles"]] == [False, True, False]
    assert [p["accuracy"] for p in document["profiles"]] == [0.9, 0.8, 0.85]
    assert document["metadata"]["screened_out"] == 1
    # Progress counts passes: three screenings, then two full measurements.
    assert seen[-1] == (5, 5)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_without_screening_every_configuration_is_measured_in_full(
    triton: LocalTriton, router: TritonRouter
) -> None:
    """screen_runs 0 (the default of `compass profile` and the profiling Job) screens nothing."""
    configs = [(FASTEST, 0.9), (ACCURATE, 0.8)]
    document = profile_configurations(
        router, configs, ProfileSettings(warmup_runs=1, measured_runs=6), lambda i: {"sample": i}
    )
    assert [p["measurement_runs"] for p in document["profiles"]] == [6, 6]
    assert document["metadata"]["screened_out"] == 0


def test_a_screening_verdict_is_rechecked_against_the_full_measurement(
    triton: LocalTriton, router: TritonRouter
) -> None:
    """When the full measurement shows the dominating configuration slower than its screening
    did, the configuration it seemed to beat is measured in full as well."""

    # rag-sim serves the quantile a request asks for: the screening pass (the first 10
    # requests: 1 + 4 for each configuration) sees every configuration at its fastest, the full
    # pass at its slowest (FASTEST's slowest is only ~10% under ACCURATE's fastest: every full
    # request at it keeps the margin clear of Triton's own per-request noise).
    sent = itertools.count()

    def payload(index: int) -> dict[str, object]:
        return {"sample": index % 100, "quantile": 0.005 if next(sent) < 10 else 0.995}

    configs = [(FASTEST, 0.9), (ACCURATE, 0.8)]
    settings = ProfileSettings(warmup_runs=1, measured_runs=30, screen_runs=4)
    seen: list[tuple[int, int]] = []
    document = profile_configurations(
        router, configs, settings, payload, lambda d, t: seen.append((d, t))
    )
    # FASTEST at its 0.5% quantile beat ACCURATE's by > 25% in the screening; in full, its
    # 99.5% quantile no longer does, so ACCURATE was measured in full too.
    assert [p["measurement_runs"] for p in document["profiles"]] == [30, 30]
    assert document["metadata"]["screened_out"] == 0
    assert seen[-1] == (4, 4)


@pytest.fixture(scope="module")
def second_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """A second tritonserver serving rag-sim: the profiling's second pod."""
    with rag_sim_server(tmp_path_factory.mktemp("triton-2")) as server:
        yield server


def _router_requests(router: TritonRouter) -> int:
    """How many requests this server's router model has served (Triton's own statistics)."""
    stats = router.client.get_inference_statistics(model_name=router.model, as_json=True)
    return sum(int(m.get("inference_count", 0)) for m in stats.get("model_stats", []))


def test_profiling_over_two_servers_measures_each_configuration_on_one_of_them(
    triton: LocalTriton,
    second_triton: LocalTriton,
    rag_sim_data: dict[str, object],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`compass profile --triton A,B`: every configuration measured once, on one server alone
    (each server's own request count is its configurations' warm-up and measured requests,
    nothing of the other's), both servers busy, the means rag-sim's, and the profiles in the
    result's order with the server that measured each."""
    configs = list(PAPER_FRONT)
    accuracies = [0.8, 0.82, 0.84, 0.86]
    feasible = [{"config": c, "accuracy": a} for c, a in zip(configs, accuracies, strict=True)]
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"feasible": feasible}))
    servers = {s.grpc_url: TritonRouter(s.grpc_url) for s in (triton, second_triton)}
    before = {url: _router_requests(r) for url, r in servers.items()}
    output = tmp_path / "profiles.json"
    addresses = ",".join(servers)
    flags = ["--warmup", "2", "--runs", "20", "--max-seconds", "120"]
    code = main(
        ["profile", "--triton", addresses, "--result", str(result), *flags, "--output", str(output)]
    )
    assert code == 0, capsys.readouterr().err
    document = json.loads(output.read_text())
    profiles = document["profiles"]
    assert [p["config"] for p in profiles] == configs
    assert [p["accuracy"] for p in profiles] == accuracies
    measured_on = [p["pod"] for p in profiles]
    assert set(measured_on) == set(servers)
    for url, client in servers.items():
        served = _router_requests(client) - before[url]
        client.close()
        assert served == 22 * measured_on.count(url)
    for entry in profiles:
        expected = _expected_mean_ms(rag_sim_data, entry["config"])
        assert expected * 0.85 <= entry["latency_mean_ms"] <= expected + 15
    out = capsys.readouterr().out
    assert "on 2 pod(s)" in out
    assert [p["measured"] for p in document["metadata"]["pods"]] == [
        measured_on.count(url) for url in sorted(servers)
    ]
