"""`compass demo --cluster`'s pure parts (the run itself is tests/e2e/test_demo_cluster.py), and
the error paths a development machine cannot show: no control plane, no development tools."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from compass.api.binding import BindingMode, BindingSettings, BindingStage
from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.api.paretopolicy import AdmissionSettings, ServingSettings
from compass.api.routing import RoutingTarget
from compass.commands.main import main
from compass.controllers.policy_compile import compile_policy
from compass.controllers.workflow_plan import plan_policy
from compass.conversion import spec_for_plan
from compass.dataplane.load import RequestRecord
from compass.domain.arrivals import make_pattern, make_scenario
from compass.domain.binding import RAG_SIM_COMPONENTS, RAG_SIM_SHARES, RAG_SIM_STAGE_PARAMS
from compass.domain.elastico import Elastico
from compass.domain.planner import Slo, plan_thresholds
from compass.domain.predictive import Predictive
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import Tick, simulate
from compass.domain.strategy import Strategy
from compass_dev import clusterdemo, clusterdemo_report
from compass_dev.clusterdemo_report import status_ticks
from compass_dev.clusterdemo_setup import (
    EXAMPLE,
    ClusterDemoSettings,
    adaptations,
    replay_ledger,
)
from compass_dev.devcluster import ClusterUnavailableError
from compass_dev.experiment import LiveRun
from compass_dev.localdemo import verdict
from compass_dev.scenarios import PAPER_FRONT, normal_profile, scaled_profile


def test_the_adapted_example_changes_only_what_it_says() -> None:
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    settings = ClusterDemoSettings(Path("out"), time_scale=0.1, measured_runs=10)
    metrics = {"type": "triton", "url": "http://127.0.0.1:1/metrics"}
    manifest, notes = adaptations(example, settings, "ledger", metrics)
    spec, shipped = manifest["spec"], example["spec"]
    assert spec["evaluation"]["evaluator"] == {"type": "replay", "replayConfigMap": "ledger"}
    assert spec["slo"]["latencyMs"] == pytest.approx(100.0)
    assert (spec["profiling"]["warmupRuns"], spec["profiling"]["measuredRuns"]) == (1, 10)
    assert spec["serving"]["metrics"] == metrics
    assert "metrics" not in shipped["serving"]  # the example reads every pod at the tick
    assert spec["serving"]["intervalSeconds"] == pytest.approx(0.1)  # 1 s of the paper's time
    assert spec["serving"]["hysteresis"]["downscaleCooldownSeconds"] == pytest.approx(2.0)
    # The rest is the example's: the space, tau and budgets, the Triton target, the Job's pod.
    for key in ("space", "triton"):
        assert spec[key] == shipped[key]
    assert spec["evaluation"]["tau"] == shipped["evaluation"]["tau"]
    assert spec["profiling"]["resources"] == shipped["profiling"]["resources"]
    assert example["spec"]["evaluation"]["evaluator"] == {"type": "triton"}  # not mutated
    # The example's serving is its own (the default, per-request binding): only the router's
    # gate is this machine's, as examples/rag-sim-triton.yaml runs it.
    assert spec["serving"].get("binding") == shipped["serving"].get("binding")
    assert spec["serving"].get("admission") == shipped["serving"].get("admission")
    assert len(notes) == 7
    assert "compass_pipeline_slots" in notes[-1]


def test_the_replay_ledger_rounds_scores_as_triton_returns_them() -> None:
    data = {"configs": {'{"a": 1}': {"scores": [0.1, 1.0]}}}
    line = yaml.safe_load(replay_ledger(data))
    assert line["config"] == {"a": 1}
    assert line["scores"][0] != 0.1  # float32's nearest
    assert line["scores"][0] == pytest.approx(0.1, abs=1e-7)


def status(index: int | None, queue: int = 0) -> dict[str, Any]:
    return {"active": {"index": index}, "lastQueueDepth": queue} if index is not None else {}


def test_ticks_come_from_the_status_samples_from_the_loads_start() -> None:
    samples = [
        (-0.5, status(3)),
        (-0.1, status(3)),
        (0.4, status(3, 2)),
        (0.9, status(None)),
        (1.2, status(0, 6)),
        (2.0, status(0, 1)),
    ]
    ticks = status_ticks(samples, lambda t: 2.0 * t, [0.0, 1.0, 2.0, 9.0, 10.0, 11.0], 0.1)
    assert [t.time_s for t in ticks] == pytest.approx([0.0, 4.0, 12.0, 20.0])
    assert [t.active for t in ticks] == [3, 3, 0, 0]
    assert [t.switched for t in ticks] == [False, False, True, False]
    assert [t.queue_depth for t in ticks] == [0, 2, 6, 1]
    assert [t.offered_qps for t in ticks] == pytest.approx([0.0, 8.0, 24.0, 40.0])
    assert math.isnan(ticks[0].observed_qps)
    assert ticks[1].observed_qps == pytest.approx(3 / 4)  # 0, 1 and 2 s within 4 s
    assert ticks[2].observed_qps == pytest.approx(3 / 5)  # 9, 10, 11 within (7, 12]


def test_no_control_plane_is_a_clear_error_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unavailable(**_: object) -> None:
        raise ClusterUnavailableError("cannot build the Kubernetes control plane here: not root")

    monkeypatch.setattr(clusterdemo, "ensure_binaries", unavailable)
    monkeypatch.setattr(clusterdemo.TritonInstallation, "find", staticmethod(lambda: None))
    assert clusterdemo.run_cluster_demo(ClusterDemoSettings(tmp_path)) == 1
    err = capsys.readouterr().err
    assert "no Kubernetes control plane on this machine" in err
    assert "not root" in err


def test_the_command_line_runs_the_cluster_demo_of_the_development_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`compass demo --cluster` finds compass_dev's demo by name and hands it its settings."""

    def unavailable(**_: object) -> None:
        raise ClusterUnavailableError("cannot build the Kubernetes control plane here: not root")

    monkeypatch.setattr(clusterdemo, "ensure_binaries", unavailable)
    monkeypatch.setattr(clusterdemo.TritonInstallation, "find", staticmethod(lambda: None))
    assert main(["demo", "--cluster", "--output-dir", str(tmp_path / "out")]) == 1
    assert "no Kubernetes control plane on this machine" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        ([], "the live demo: needs the development tools"),
        (["--cluster"], "'--cluster': unknown here: the live demo's flags need the development"),
        (["--runs", "fastest"], "'--runs': unknown here: the live demo's flags need"),
        (["--search-only", "--cluster"], "'--cluster': unknown here"),
    ],
)
def test_without_the_development_tools_the_demo_says_what_to_install(
    argv: list[str],
    start: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A plain `pip install` of the operator has no compass_dev: one line, naming the fix."""
    monkeypatch.setitem(sys.modules, "compass_dev", None)  # as if not installed
    assert main(["demo", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"compass demo: error: {start}")
    assert "pip install -e dev/" in line
    assert "--search-only" in line


def test_the_summary_reads_the_policy_against_both_static_ends() -> None:
    front = [
        LatencyProfile({"c": "fastest"}, 0.7, 100.0, 150.0),
        LatencyProfile({"c": "accurate"}, 0.9, 900.0, 1200.0),
    ]

    def run(label: str, latencies_s: list[float], score: float, served: list[str]) -> LiveRun:
        records = tuple(
            RequestRecord(float(i), latency, json.dumps({"c": config}), score, None)
            for i, (latency, config) in enumerate(zip(latencies_s, served, strict=True))
        )
        return LiveRun(label, 1000.0, len(records), records)

    runs = {
        "fastest": run("fastest", [0.1, 0.2, 0.3, 0.4], 0.75, ["fastest"] * 4),
        "accurate": run("accurate", [0.5, 2.0, 3.0, 4.0], 0.875, ["accurate"] * 4),
        "policy": run("policy", [0.1, 0.5, 0.9, 1.5], 0.8125, ["fastest"] * 3 + ["accurate"]),
    }
    assert verdict(runs, front, "the operator") == (
        "the operator met the SLO for 75.0% of requests (static most accurate: 25.0%) at "
        "accuracy 0.8125 (served 0.7500) (static fastest: 0.7500 (served 0.7000))"
    )


def test_the_prediction_runs_the_policys_own_strategy_and_admission_at_paper_scale() -> None:
    """The simulator's prediction beside a live run is the policy the operator ran (its
    strategy, its admission), not always Elastico, with the times back at the paper's scale."""
    profiles = [normal_profile(f"c{i}", 0.7 + 0.05 * i, 100.0 + 60 * i, 10.0) for i in range(3)]
    plan = plan_thresholds(profiles, Slo(1000.0))
    scale = 0.1
    spec = spec_for_plan(
        plan, serving=ServingSettings(binding=BindingSettings(mode=BindingMode.WORKFLOW))
    )
    elastico = clusterdemo_report.unscaled_policy(spec, plan, scale)
    assert isinstance(elastico, Elastico)
    assert elastico.settings.stale_after_s == pytest.approx(spec.stale_after_seconds / scale)
    assert clusterdemo_report.unscaled_admission(spec, scale) is None
    chosen = spec.model_copy(
        update={
            "strategy": Strategy.PREDICTIVE,
            "admission": AdmissionSettings(enabled=True, degrade_after=0.5),
        }
    )
    assert isinstance(clusterdemo_report.unscaled_policy(chosen, plan, scale), Predictive)
    admission = clusterdemo_report.unscaled_admission(chosen, scale)
    assert admission is not None
    assert admission.slo_ms == pytest.approx(chosen.slo.latency_ms / scale)
    assert admission.degrade_after == pytest.approx(0.5)


def test_the_prediction_starts_where_the_live_run_starts() -> None:
    """The live run starts on the member the idle policy climbed to; a prediction that started
    on the fastest would serve a climb the live run never made."""
    profiles = [normal_profile(f"c{i}", 0.7 + 0.05 * i, 100.0 + 60 * i, 10.0) for i in range(3)]
    plan = plan_thresholds(profiles, Slo(1000.0))
    spec = spec_for_plan(plan)
    top = plan.eligible[-1]
    policy = clusterdemo_report.unscaled_policy(spec, plan, 1.0)
    assert policy.initial_state(0.0).active == plan.names[plan.eligible[0]]
    starting = clusterdemo_report.StartingOn(policy, top)
    assert starting.initial_state(0.0).active == plan.names[top]
    # A light load (well within every member's limits) keeps it there from the first tick.
    scenario = make_scenario(make_pattern("step", 0.2, 30.0, seed=0), 0)
    report = simulate(starting, profiles, scenario, 1000.0)
    assert [tick.active for tick in report.ticks[:3]] == [top] * 3
    fresh = simulate(policy, profiles, scenario, 1000.0)
    assert fresh.ticks[0].active == plan.eligible[0]


def _rag_sim_profiles(scale: float) -> str:
    """Profiles of the paper's front as the profiling Job writes them, through a router that
    timed each component (the accurate ones' time mostly at the generator)."""
    entries = []
    for i, config in enumerate(PAPER_FRONT):
        mean = (130.0 + 60 * i) * scale
        parts = {"retriever": 0.1 * mean, "reranker": (0.15 + 0.02 * i) * mean}
        parts["generator"] = 0.95 * mean - sum(parts.values())  # 5%: the router's own
        entries.append(
            {
                "config": config,
                "accuracy": 0.80 + 0.01 * i,
                "latency_mean_ms": mean,
                "latency_p95_ms": 1.2 * mean,
                "component_ms": parts,
            }
        )
    return json.dumps({"profiles": entries})


def test_late_binding_reaches_the_routers_table_through_the_workflow_and_the_operator() -> None:
    """The example's workflow: its serving.binding and admission go into the ParetoPolicy the
    workflow plans, and the operator's compiled table splits each front member's time by the
    component times the profiling Job measured, with the lag cap and no wait rule.
    --whole-workflow takes both out (and the gate): Elastico alone."""
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    scale = 0.25
    settings = ClusterDemoSettings(Path("out"), time_scale=scale)
    metrics = {"type": "triton", "url": "http://127.0.0.1:1/metrics"}
    manifest, notes = adaptations(example, settings, "ledger", metrics)
    whole, whole_notes = adaptations(
        example,
        ClusterDemoSettings(Path("out"), time_scale=scale, late_binding=False),
        "ledger",
        metrics,
    )
    assert len(notes) == len(whole_notes)
    assert notes[:-1] == whole_notes[:-1]
    assert "compass_pipeline_slots" in notes[-1]
    assert "removed (--whole-workflow)" in whole_notes[-1]
    serving = manifest["spec"]["serving"]
    # Whole-workflow switching asked for by name: per-request binding is the default.
    assert {k: v for k, v in serving.items() if k not in ("binding", "admission")} == {
        k: v for k, v in whole["spec"]["serving"].items() if k != "binding"
    }
    assert whole["spec"]["serving"]["binding"] == {"mode": "workflow"}
    # The example serves the default: per-request binding of the whole configuration.
    assert "binding" not in serving
    assert "admission" not in serving

    # The cap as --binding-lag and --binding-lag-reserve give it.
    looser = ClusterDemoSettings(Path("out"), binding_lag_share=0.5, binding_lag_reserve=1)
    loose, loose_notes = adaptations(example, looser, "ledger", metrics)
    assert loose["spec"]["serving"]["binding"]["lagShare"] == 0.5
    assert loose["spec"]["serving"]["binding"]["lagReserve"] == 1
    assert "lagShare 0.3 -> 0.5, lagReserve 2 -> 1" in loose_notes[-2]
    assert "binding" not in example["spec"]["serving"]  # not mutated

    workflow = CompoundWorkflowSpec.model_validate(manifest["spec"])
    outcome = plan_policy(
        workflow, _rag_sim_profiles(scale), RoutingTarget(grpc_endpoint="127.0.0.1:1"), ""
    )
    assert outcome.policy_spec is not None, outcome.message
    compiled = compile_policy(outcome.policy_spec, 1)
    table = compiled.binding
    assert table is not None
    assert (table["lag_share"], table["lag_reserve"]) == (0.3, 2)
    assert table["degrade_after"] is None  # the cap replaces the wait rule
    assert table["refuse"] is True
    assert table["slo_ms"] == pytest.approx(1000.0 * scale)
    assert table["components"] == [[]]  # the whole configuration, bound at take-up
    assert compiled.admission is not None
    for entry in table["configs"]:
        assert len(entry["stage_ms"]) == 1
        assert entry["max_qps"] is not None


def test_the_summary_lines_read_the_gap_and_issue_42s_floor() -> None:
    front = [
        LatencyProfile({"c": "fastest"}, 0.70, 100.0, 150.0),
        LatencyProfile({"c": "middle"}, 0.80, 400.0, 500.0),
        LatencyProfile({"c": "accurate"}, 0.90, 900.0, 1200.0),
    ]
    plan = plan_thresholds(front, Slo(2000.0))

    def run(latencies_s: list[float], served: list[str]) -> LiveRun:
        records = tuple(
            RequestRecord(float(i), latency, json.dumps({"c": config}), 0.8, None)
            for i, (latency, config) in enumerate(zip(latencies_s, served, strict=True))
        )
        return LiveRun("run", 1000.0, len(records), records)

    fastest = run([0.1] * 4, ["fastest"] * 4)
    # Half the gap at static fastest's compliance: the floor is met.
    half = run([0.1, 0.2, 0.3, 0.4], ["fastest", "middle", "middle", "accurate"])
    assert clusterdemo_report.gap_share(half, front) == pytest.approx(50.0)
    assert clusterdemo_report.served_mix(half, plan) == {0: 1, 1: 2, 2: 1}
    line = clusterdemo_report.floor_verdict({"policy": half, "fastest": fastest}, front, "binding")
    assert "binding 50% at +0.0 points" in line
    assert line.endswith(" points) met")
    # The same mix a request later than static fastest (25 points): not met.
    late = run([0.1, 0.2, 0.3, 1.4], ["fastest", "middle", "middle", "accurate"])
    line = clusterdemo_report.floor_verdict({"policy": late, "fastest": fastest}, front, "binding")
    assert "at -25.0 points" in line
    assert line.endswith("not met")
    # A fifth of the gap at full compliance: not met either.
    little = run([0.1] * 5, ["fastest"] * 4 + ["middle"])
    assert clusterdemo_report.gap_share(little, front) == pytest.approx(10.0)
    assert clusterdemo_report.floor_verdict(
        {"policy": little, "fastest": fastest}, front, "x"
    ).endswith("not met")


def test_the_binding_prediction_is_the_gated_routers_rule_and_the_cap_holds_it_back() -> None:
    """The simulator's late binding beside the live run: at the paper's scale on the table's
    own numbers; a tighter lag cap keeps it nearer the fastest on the same arrivals."""
    profiles = [
        replace(p, config=dict(config))
        for p, config in zip(
            [normal_profile(f"c{i}", 0.80 + 0.01 * i, 130.0 + 60 * i, 15.0) for i in range(4)],
            PAPER_FRONT,
            strict=True,
        )
    ]
    plan = plan_thresholds(profiles, Slo(1000.0))
    scale = 0.25
    binding = BindingSettings(
        mode=BindingMode.PER_STAGE,
        stages=[
            BindingStage(component=c, parameters=list(names), share=share)
            for c, names, share in zip(
                RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, RAG_SIM_SHARES, strict=True
            )
        ],
        lag_share=0.3,
        lag_reserve=2,
    )
    # The operator's spec is at rag-sim's scale; the demo predicts on the plan at the paper's.
    scaled = plan_thresholds([scaled_profile(p, scale) for p in profiles], Slo(1000.0 * scale))
    spec = spec_for_plan(
        scaled,
        admission=AdmissionSettings(enabled=True, degrade_after=1),
        binding=binding,
    )
    scenario = make_scenario(make_pattern("spike", 1.5, 120.0, seed=3), 3)
    report = clusterdemo_report.binding_prediction(spec, plan, profiles, scenario, 1000.0, scale)
    fastest, accurate = profiles[0].accuracy, profiles[-1].accuracy
    assert fastest < report.mean_accuracy < accurate
    assert 0 < report.compliance <= 100
    tight = spec.model_copy(
        update={"binding": binding.model_copy(update={"lag_share": 0.01, "lag_reserve": 0})}
    )
    held = clusterdemo_report.binding_prediction(tight, plan, profiles, scenario, 1000.0, scale)
    assert held.mean_accuracy < report.mean_accuracy


def test_with_late_binding_the_timeline_draws_what_served_the_requests() -> None:
    """The routers chose per request: each tick shows the member that served most of the
    requests sent over the 5 s before it, whatever the policy held."""
    front = [
        LatencyProfile({"c": "fastest"}, 0.70, 100.0, 150.0),
        LatencyProfile({"c": "accurate"}, 0.90, 400.0, 500.0),
    ]
    plan = plan_thresholds(front, Slo(2000.0))
    served = [(0.5, "accurate"), (1.0, "accurate"), (6.0, "fastest"), (6.5, "fastest")]
    records = tuple(
        RequestRecord(at, 0.1, json.dumps({"c": config}), 0.8, None) for at, config in served
    )
    run = LiveRun("policy", 1000.0, len(records), records)
    held = [Tick(t, 1.0, 1.0, 0, active=1, switched=False) for t in (0.0, 2.0, 7.0, 20.0)]
    ticks = clusterdemo_report.served_ticks(held, run, plan)
    # Nothing sent yet: the policy's own; then the accurate pair; then the fastest pair; then
    # nothing in the window: the last one's.
    assert [t.active for t in ticks] == [1, 1, 0, 0]
    assert [t.switched for t in ticks] == [False, False, True, False]
    assert [t.time_s for t in ticks] == [t.time_s for t in held]
