"""`compass profile` against a real Triton: the profiles the planner reads, measured for real.

Every time a test here reads (a mean's bounds, a screening verdict) sits on configurations whose
service times differ by 200 ms or more, served by this module's own servers at rag-sim's
measured latencies (the tier's TIME_SCALE is a tenth): Triton's own overhead per request, a few
ms on a quiet machine, was up to 100 ms on four requests' mean at a load of 11 on 2 cores (its
worst single request 360 ms), and cannot turn a verdict or cross a bound.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ragsim import ACCURATE, COMPONENTS, FASTEST

from compass.commands.main import main
from compass.dataplane.profiler import ProfileSettings, profile_configurations
from compass.dataplane.triton import TritonRouter
from compass.domain.evaluation import Config
from compass.domain.space import config_key
from compass_dev.local_triton import LocalTriton, local_fleet
from compass_dev.scenarios import rag_sim_triton
from tiers import require_tritonserver

# rag-sim's latencies as measured, on this module's servers: FASTEST ~134 ms, ACCURATE ~259 ms.
SCALE = 1.0


def _rag(model: str, retriever_k: int, reranker_k: int, reranker: str) -> Config:
    return {
        "generator_model": model,
        "retriever_k": retriever_k,
        "reranker_k": reranker_k,
        "reranker_model": reranker,
    }


# The grid's quickest configuration (mean 30 ms unscaled, 22-43 ms over its quantiles), its
# slowest-but-one (567 ms, 405-690 ms) and a wide one (226 ms at its 0.5% quantile, 557 ms at
# its 99.5%).
QUICK = _rag("llama3.2:3b", 3, 1, "ms-marco")
SLOW = _rag("gemma3:12b", 20, 10, "bge-v2")
WIDE = _rag("llama3.1:8b", 10, 10, "bge-v2")


def _latency_ms(data: dict[str, object], config: Config, quantile: float | None = None) -> float:
    """rag-sim's service time of a configuration on this module's servers: its mean, or at
    one quantile of its distribution."""
    configs = data["configs"]
    assert isinstance(configs, dict)
    quantiles = np.asarray(configs[json.dumps(config, sort_keys=True)]["latency_quantiles_ms"])
    if quantile is None:
        # The grid's points are midpoints of equal-probability bins: the mean is their average.
        return float(np.mean(quantiles)) * SCALE
    grid = np.asarray(data["quantile_grid"])
    return float(np.interp(quantile, grid, quantiles)) * SCALE


def _assert_is_its_service_time(mean_ms: float, expected_ms: float) -> None:
    """A measured mean is rag-sim's for its configuration plus Triton's overhead."""
    # From below: every request sleeps its share of the calibrated time, so only the sampling
    # of a few requests' random quantiles can take the mean under it. From above: generous, as
    # the overhead grows with the machine's load; the configurations it is told apart from are
    # 2x to 19x away.
    assert 0.85 * expected_ms <= mean_ms <= 2 * expected_ms + 100, (mean_ms, expected_ms)


def _server(workdir: Path, host: str) -> LocalTriton:
    """A rag-sim tritonserver at SCALE, FASTEST active, not started."""
    return rag_sim_triton(workdir, SCALE, FASTEST, host=host)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalTriton]]:
    """Two rag-sim tritonservers at SCALE, FASTEST active: the profiling's pods."""
    require_tritonserver()
    with local_fleet(tmp_path_factory.mktemp("fleet"), 2, _server) as started:
        yield started


@pytest.fixture
def slow_router(servers: list[LocalTriton]) -> Iterator[TritonRouter]:
    """A client of the first server's router."""
    client = TritonRouter(servers[0].grpc_url, backoff_s=0.05)
    yield client
    client.close()


def test_profile_measures_each_feasible_configuration_without_moving_traffic(
    servers: list[LocalTriton],
    slow_router: TritonRouter,
    rag_sim_data: dict[str, object],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = tmp_path / "result.json"
    result.write_text(
        json.dumps(
            {
                "feasible": [
                    {"config": SLOW, "accuracy": 0.86, "samples": 100},
                    {"config": QUICK, "accuracy": 0.84, "samples": 100},
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
            servers[0].grpc_url,
            "--result",
            str(result),
            "--warmup",
            "2",
            "--runs",
            "10",
            "--output",
            str(output),
        ]
    )
    assert code == 0
    document = json.loads(output.read_text())
    profiles = {config_key(p["config"]): p for p in document["profiles"]}
    assert set(profiles) == {config_key(SLOW), config_key(QUICK)}
    for config, accuracy in ((SLOW, 0.86), (QUICK, 0.84)):
        entry = profiles[config_key(config)]
        assert entry["accuracy"] == accuracy
        assert entry["measurement_runs"] == 10
        assert entry["warmup_runs"] == 2
        assert 0 < entry["latency_p50_ms"] <= entry["latency_p95_ms"] <= entry["latency_p99_ms"]
        assert entry["latency_std_ms"] > 0
        # Each configuration measured with its own override: SLOW's mean (~570 ms) is 15x
        # QUICK's (~37 ms), so either one measured as the other crosses a bound.
        _assert_is_its_service_time(entry["latency_mean_ms"], _latency_ms(rag_sim_data, config))
        # Each component model's mean time, as the router timed its calls: parts of the whole.
        assert set(entry["component_ms"]) == set(COMPONENTS)
        assert 0 < sum(entry["component_ms"].values()) <= entry["latency_mean_ms"]
    # Profiling used per-request overrides: production stayed on FASTEST throughout.
    assert slow_router.active_config() == config_key(FASTEST)


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
    slow_router: TritonRouter, rag_sim_data: dict[str, object]
) -> None:
    """A configuration that a more accurate one beats clearly keeps its screening profile; a
    near tie is measured in full."""
    # The margin's arithmetic is tests/unit/test_profiles.py's; here the passes over a real
    # router, at a margin (1.0: twice as fast) that load cannot cross. SLOW (~570 ms) told it
    # is less accurate than QUICK (~35 ms) cannot be on the front: it is timed only by the
    # screening pass. ACCURATE against itself under another claimed accuracy is a tie (~260 ms
    # each): turning it would take 260 ms more of overhead on one twin's mean than the other's.
    configs = [(QUICK, 0.9), (SLOW, 0.8), (ACCURATE, 0.95), (dict(ACCURATE), 0.93)]
    settings = ProfileSettings(warmup_runs=1, measured_runs=6, screen_runs=4, screen_margin=1.0)
    quick, slow = (_latency_ms(rag_sim_data, c, 0.5) for c in (QUICK, SLOW))
    assert 2 * quick + 400 < slow
    seen: list[tuple[int, int]] = []
    document = profile_configurations(
        slow_router,
        configs,
        settings,
        lambda i: {"sample": i % 100, "quantile": 0.5},
        lambda d, t: seen.append((d, t)),
    )
    runs = [p["measurement_runs"] for p in document["profiles"]]
    assert runs == [6, 4, 6, 6]
    assert [p.get("screened", False) for p in document["profiles"]] == [False, True, False, False]
    assert [p["accuracy"] for p in document["profiles"]] == [0.9, 0.8, 0.95, 0.93]
    assert document["metadata"]["screened_out"] == 1
    # Progress counts passes: four screenings of eight planned, then three full measurements.
    assert seen == [(1, 8), (2, 8), (3, 8), (4, 8), (5, 7), (6, 7), (7, 7)]


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
    slow_router: TritonRouter, rag_sim_data: dict[str, object]
) -> None:
    """When the full measurement shows the dominating configuration slower than its screening
    did, the configuration it seemed to beat is measured in full as well."""

    # rag-sim serves the quantile a request asks for. The screening pass (the first 10 requests:
    # 1 + 4 for each configuration) sees WIDE at its fastest (~226 ms) and SLOW at its 10%
    # quantile (~487 ms): more than 25% slower, so SLOW is screened out. The full pass sees WIDE
    # at its slowest (~557 ms): no longer 25% faster than SLOW's screening, so SLOW is measured
    # in full. Each verdict has 200 ms to spare, twice what Triton's overhead on four requests'
    # mean reached at a load of 11.
    fastest, slowest = (_latency_ms(rag_sim_data, WIDE, q) for q in (0.005, 0.995))
    screened = _latency_ms(rag_sim_data, SLOW, 0.1)
    assert 1.25 * fastest + 200 < screened < 1.25 * slowest - 200
    sent = itertools.count()

    def payload(index: int) -> dict[str, object]:
        n = next(sent)
        quantile = 0.005 if n < 5 else 0.1 if n < 10 else 0.995
        return {"sample": index % 100, "quantile": quantile}

    configs = [(WIDE, 0.9), (SLOW, 0.8)]
    # No pod warm-up: the payload's schedule counts every request sent.
    settings = ProfileSettings(warmup_runs=1, measured_runs=6, screen_runs=4, pod_warmup_runs=0)
    seen: list[tuple[int, int]] = []
    document = profile_configurations(
        slow_router, configs, settings, payload, lambda d, t: seen.append((d, t))
    )
    assert [p["measurement_runs"] for p in document["profiles"]] == [6, 6]
    assert document["metadata"]["screened_out"] == 0
    # Screened out at first (three passes planned after the screening), then rechecked.
    assert seen == [(1, 4), (2, 4), (3, 3), (4, 4)]


def _router_requests(router: TritonRouter) -> int:
    """How many requests this server's router model has served (Triton's own statistics)."""
    stats = router.client.get_inference_statistics(model_name=router.model, as_json=True)
    return sum(int(m.get("inference_count", 0)) for m in stats.get("model_stats", []))


def test_profiling_over_two_servers_measures_each_configuration_on_one_of_them(
    servers: list[LocalTriton],
    rag_sim_data: dict[str, object],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`compass profile --triton A,B`: every configuration measured once, on one server alone
    (each server's own request count is its configurations' warm-up and measured requests,
    nothing of the other's), both servers busy, the means rag-sim's, and the profiles in the
    result's order with the server that measured each."""
    # Each about twice the one before or more (~30, 134, 259, 567 ms): an entry holding
    # another configuration's measurement falls under its bound.
    configs = [QUICK, FASTEST, ACCURATE, SLOW]
    accuracies = [0.8, 0.82, 0.84, 0.86]
    feasible = [{"config": c, "accuracy": a} for c, a in zip(configs, accuracies, strict=True)]
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"feasible": feasible}))
    routers = {s.grpc_url: TritonRouter(s.grpc_url) for s in servers}
    before = {url: _router_requests(r) for url, r in routers.items()}
    output = tmp_path / "profiles.json"
    addresses = ",".join(routers)
    flags = ["--warmup", "2", "--runs", "10", "--max-seconds", "120"]
    code = main(
        ["profile", "--triton", addresses, "--result", str(result), *flags, "--output", str(output)]
    )
    assert code == 0, capsys.readouterr().err
    document = json.loads(output.read_text())
    profiles = document["profiles"]
    assert [p["config"] for p in profiles] == configs
    assert [p["accuracy"] for p in profiles] == accuracies
    measured_on = [p["pod"] for p in profiles]
    assert set(measured_on) == set(routers)
    for url, client in routers.items():
        served = _router_requests(client) - before[url]
        client.close()
        # Each pod's warm-up, then 2 + 10 requests a configuration it measured.
        assert served == ProfileSettings().pod_warmup_runs + 12 * measured_on.count(url)
    for entry in profiles:
        expected = _latency_ms(rag_sim_data, entry["config"])
        _assert_is_its_service_time(entry["latency_mean_ms"], expected)
    out = capsys.readouterr().out
    assert "on 2 pod(s)" in out
    assert [p["measured"] for p in document["metadata"]["pods"]] == [
        measured_on.count(url) for url in sorted(routers)
    ]
