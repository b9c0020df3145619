"""rag-sim's shared facts: the spike every live demo run serves, its paired requests, its Triton."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compass.domain.arrivals import SPIKE_FACTOR
from compass.domain.planner import Slo, plan_from_profiles
from compass.domain.profiles import LatencyProfile
from compass.domain.space import config_key
from compass_dev import scenarios
from compass_dev.local_triton import LocalServerError, LocalTriton
from compass_dev.scenarios import (
    ACCURATE,
    FASTEST,
    PAPER_FRONT,
    PAPER_PEAK_UTILIZATION,
    RagSimLoad,
    profiling_payload,
    rag_sim_data,
    rag_sim_fleet,
    rag_sim_triton,
    spike_scenario,
)

PLAN = plan_from_profiles(
    [
        LatencyProfile(FASTEST, 0.83, mean_ms=150.0, p95_ms=180.0),
        LatencyProfile(ACCURATE, 0.86, mean_ms=300.0, p95_ms=360.0),
    ],
    Slo(1000.0, 95.0),
    50.0,
)


def test_the_spike_loads_the_fastest_configuration_as_the_papers_loads_the_papers() -> None:
    scenario = spike_scenario(PLAN, 180.0, seed=0)
    peak = SPIKE_FACTOR * scenario.pattern.base_qps * 0.150
    assert peak == pytest.approx(PAPER_PEAK_UTILIZATION)
    assert round(PAPER_PEAK_UTILIZATION, 2) == 0.77  # bench/README.md's demo run prints it
    assert spike_scenario(PLAN, 180.0, seed=0, base_qps=2.0).pattern.base_qps == 2.0


def test_every_run_of_a_load_sends_the_same_requests() -> None:
    scenario = spike_scenario(PLAN, 30.0, seed=3)
    load = RagSimLoad(scenario)
    again = RagSimLoad(spike_scenario(PLAN, 30.0, seed=3))
    assert load.arrivals_s(0.1) == pytest.approx([0.1 * t for t in again.arrivals_s()])
    index = scenario.requests - 1
    assert load.payload(index) == again.payload(index)
    assert load.payload(index)["sample"] == index % scenarios.QUESTIONS
    assert load.payload(index)["quantile"] == pytest.approx(float(scenario.luck[index]))
    base = scenario.pattern.base_qps
    assert [load.offered_qps(t) for t in (1.0, 15.0, 25.0)] == pytest.approx(
        [base, SPIKE_FACTOR * base, base]
    )


def test_a_profile_measures_the_whole_latency_distribution_not_forty_draws_of_it() -> None:
    warmup, runs = 5, 40
    payloads = [profiling_payload(i, warmup, runs) for i in range(warmup + runs)]
    assert [p["sample"] for p in payloads] == [i % scenarios.QUESTIONS for i in range(45)]
    assert {p["quantile"] for p in payloads[:warmup]} == {0.5}
    quantiles = sorted(float(str(p["quantile"])) for p in payloads[warmup:])
    assert quantiles == pytest.approx([(k + 0.5) / runs for k in range(runs)])
    # What rag-sim serves at those quantiles has the configuration's own mean, where forty
    # random draws of it stray by a few ms.
    data = rag_sim_data()
    served = np.asarray(data["configs"][config_key(PAPER_FRONT[0])]["latency_quantiles_ms"])
    grid = np.asarray(data["quantile_grid"])
    true_mean = float(np.mean(np.interp(np.linspace(0, 1, 100_001), grid, served)))
    assert float(np.mean(np.interp(quantiles, grid, served))) == pytest.approx(true_mean, rel=0.003)


def test_the_test_pair_is_on_the_papers_front_fastest_first() -> None:
    assert PAPER_FRONT.index(FASTEST) < PAPER_FRONT.index(ACCURATE)
    data = scenarios.rag_sim_data()
    for config in PAPER_FRONT:
        assert config_key(config) in data["configs"]


def test_the_triton_serves_rag_sim_at_the_time_scale_from_the_active_configuration(
    tmp_path: Path,
) -> None:
    triton = rag_sim_triton(tmp_path, 0.1, FASTEST)
    assert list(triton.models) == []  # all of them: the components, router and router_control
    control = (triton.repository / "router_control" / "1" / "model.py").read_text()
    assert control == (triton.repository / "router" / "1" / "model.py").read_text()
    for component in scenarios.COMPONENTS:
        config = (triton.repository / component / "config.pbtxt").read_text()
        assert 'key: "time_scale" value: { string_value: "0.1" }' in config
    router = (triton.repository / "router" / "config.pbtxt").read_text()
    assert json.dumps(config_key(FASTEST))[1:-1] in router


def test_a_fleet_stops_every_server_it_started_when_one_fails_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second of three servers never becomes ready: the first, and the second's process,
    are stopped, the third is never started, and the caller sees the start's error. (A real
    tritonserver that fails to start is hard to arrange; tests/triton/test_fleet.py starts a
    real fleet.)"""
    started: list[str] = []
    stopped: list[str] = []
    failing = {"127.0.3.2"}

    def start(self: LocalTriton, workdir: Path) -> LocalTriton:
        started.append(self.host)
        assert workdir == tmp_path / f"pod{len(started) - 1}"
        if self.host in failing:
            raise LocalServerError("tritonserver not ready")
        return self

    monkeypatch.setattr(LocalTriton, "start", start)
    monkeypatch.setattr(LocalTriton, "stop", lambda self: stopped.append(self.host))
    with pytest.raises(LocalServerError, match="not ready"), rag_sim_fleet(tmp_path, 0.1, 3):
        pytest.fail("a fleet that did not start was entered")
    assert started == ["127.0.3.1", "127.0.3.2"]
    assert sorted(stopped) == ["127.0.3.1", "127.0.3.2"]

    started.clear()
    stopped.clear()
    failing.clear()
    with rag_sim_fleet(tmp_path, 0.1, 2, router_instances=4) as servers:
        assert [s.host for s in servers] == ["127.0.3.1", "127.0.3.2"]
        for server in servers:
            router = (server.repository / "router" / "config.pbtxt").read_text()
            assert "count: 4" in router
        assert not stopped
    assert sorted(stopped) == ["127.0.3.1", "127.0.3.2"]
