"""The llm-d gateway's serving in the simulator: a gateway policy's mix drawn per request by
weight, through compass.conversion and `compass simulate`, the routers' dealing unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from compass.api.paretopolicy import ParetoPolicySpec
from compass.commands.main import main
from compass.conversion import (
    mix_dealing,
    planned_manifest,
    policy_plan,
    runtime_policy,
    simulate_serving,
)
from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.mix import Dealing
from compass.domain.podmodel import PodModel
from compass.domain.simulator import simulate

SMALL = {"model": "qwen-small"}
LARGE = {"model": "qwen-large"}
GATEWAY = {
    "actuator": "inferenceModelRewrite",
    "modelRewrite": {"name": "chat", "poolRef": {"name": "qwen-pool"}, "model": "chat"},
}


def spec_fields(**overrides: Any) -> dict[str, Any]:
    """Two model variants behind one llm-d pool, split by load."""
    fields: dict[str, Any] = {
        "front": [
            {"config": SMALL, "accuracy": 0.70, "latencyMeanMs": 40, "latencyP95Ms": 60},
            {"config": LARGE, "accuracy": 0.85, "latencyMeanMs": 90, "latencyP95Ms": 130},
        ],
        "slo": {"latencyMs": 600},
        "strategy": "split",
        "binding": {"mode": "workflow"},
        "admission": {"enabled": False},
        "routing": GATEWAY,
    }
    fields.update(overrides)
    return fields


def test_the_actuator_decides_how_a_mix_is_dealt() -> None:
    assert mix_dealing(ParetoPolicySpec.model_validate(spec_fields())) is Dealing.DRAW
    routers = spec_fields(routing={"service": "qwen-triton"})
    assert mix_dealing(ParetoPolicySpec.model_validate(routers)) is Dealing.ROUND_ROBIN
    assert mix_dealing(ParetoPolicySpec.model_validate(spec_fields(routing=None))) is (
        Dealing.ROUND_ROBIN
    )


def test_simulate_serving_draws_a_gateway_policys_mix_per_request() -> None:
    spec = ParetoPolicySpec.model_validate(spec_fields())
    triton = ParetoPolicySpec.model_validate(spec_fields(routing=None))
    scenario = make_scenario(make_pattern("spike", 12.0, 300.0), 5)
    served = simulate_serving(spec, scenario)
    plan = policy_plan(spec)
    expected = simulate(
        runtime_policy(spec, plan),
        [t.profile for t in plan.thresholds],
        scenario,
        spec.slo.latency_ms,
        interval_s=spec.interval_seconds,
        switch_delay_s=spec.switch_delay_ms / 1000,
        pod_model=PodModel(spec.router_instances),
        dealing=Dealing.DRAW,
    )
    assert np.array_equal(served.configs, expected.configs)
    assert np.array_equal(served.finishes_s, expected.finishes_s)
    # The split blends under this load, and the routers would have dealt it otherwise.
    assert any(tick.mix is not None and tick.mix.blend is not None for tick in served.ticks)
    dealt = simulate_serving(triton, scenario)
    assert not np.array_equal(served.configs, dealt.configs)


@pytest.fixture
def gateway_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A gateway policy's manifest in the cwd."""
    monkeypatch.chdir(tmp_path)
    manifest = planned_manifest("chat", "llm", spec_fields())
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    return path


def test_compass_simulate_predicts_the_gateways_draw(
    gateway_policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["simulate", "--policy", str(gateway_policy), "--pattern", "spike", "--seed", "5"]
    assert main([*command, "--base-qps", "12", "--duration", "300"]) == 0
    out = capsys.readouterr().out
    assert "through the llm-d gateway (each request's model drawn by weight)" in out
    timeline = json.loads(Path("compass-timeline.json").read_text(encoding="utf-8"))
    spec = ParetoPolicySpec.model_validate(spec_fields())
    predicted = simulate_serving(spec, make_scenario(make_pattern("spike", 12.0, 300.0), 5))
    names = predicted.names
    served = [request["configuration"] for request in timeline["requests"]]
    assert served == [names[int(c)] for c in predicted.configs]
    # The gateway has no admission: asking for it is a usage error naming the flag.
    assert main([*command, "--admission"]) == 2
    assert "--admission: the gateway (routing.actuator inferenceModelRewrite)" in (
        capsys.readouterr().err
    )
