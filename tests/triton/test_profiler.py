"""`compass profile` against a real Triton: the profiles the planner reads, measured for real."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ragsim import ACCURATE, FASTEST, TIME_SCALE

from compass.cli import main
from compass.domain.space import config_key
from compass.serving.local import LocalTriton
from compass.serving.triton import TritonRouter


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
