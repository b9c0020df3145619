"""`compass plan` and `compass simulate`: the happy path, and every bad input as one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_inputs import PROFILES

from compass.api.binding import BindingMode
from compass.api.paretopolicy import ParetoPolicySpec
from compass.commands.main import main
from compass.conversion import admission_rule, policy_plan
from compass.domain.planner import Slo, ThresholdModel, plan_from_profiles
from compass.domain.profiles import parse_profiles


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd holding profiles.json."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": PROFILES}), encoding="utf-8")
    return tmp_path


def one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"compass {command}: error: "), err
    return lines[0]


# ---------------------------------------------------------------------------- happy path


def test_plan_prints_the_front_and_writes_the_policy(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The front (fastest first) with its thresholds, and a ParetoPolicy manifest that reloads."""
    code = main(["plan", "--profiles", "profiles.json", "--slo-ms", "1000"])
    out, err = capsys.readouterr()
    assert code == 0, err
    expected = plan_from_profiles(parse_profiles({"profiles": PROFILES}), Slo(1000))
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row.split()[-1] for row in rows] == ["fast/3", "mid/3", "slow/3"]
    for row, threshold in zip(rows, expected.thresholds, strict=True):
        cells = row.split()
        assert cells[5] == str(threshold.stay_max_queue)
        assert cells[6] == str(threshold.enter_max_queue)
        assert float(cells[7]) == pytest.approx(threshold.stay_max_qps, abs=0.006)
    assert "4 profiles -> Pareto front of 3" in out
    manifest = yaml.safe_load((workdir / "paretopolicy.yaml").read_text(encoding="utf-8"))
    # Applyable as it is: kubectl apply -f paretopolicy.yaml (the current namespace).
    assert (manifest["apiVersion"], manifest["kind"]) == ("compass.io/v1alpha1", "ParetoPolicy")
    assert manifest["metadata"] == {"name": "paretopolicy"}
    document = manifest["spec"]
    assert document["slo"] == {"latencyMs": 1000.0, "percentile": 95.0}
    assert document["hysteresis"]["downscaleCooldownSeconds"] == 5.0
    assert document["hysteresis"]["upscaleCooldownSeconds"] == 0.0
    assert document["hysteresis"]["slackBufferMs"] == 50.0
    assert document["thresholdModel"] == "tail"
    spec = ParetoPolicySpec.model_validate(document)
    assert [entry.config["model"] for entry in spec.front] == ["fast", "mid", "slow"]
    assert policy_plan(spec).thresholds == expected.thresholds


def test_plan_options_and_json_output(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--percentile, --slack-ms and --model reach the policy; a .json output is JSON."""
    code = main(
        [
            "plan",
            "--profiles",
            "profiles.json",
            "--slo-ms",
            "800",
            "--percentile",
            "99",
            "--slack-ms",
            "20",
            "--model",
            "paper-mean",
            "--output",
            "policy.json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    manifest = json.loads((workdir / "policy.json").read_text())
    assert manifest["metadata"] == {"name": "policy"}
    spec = ParetoPolicySpec.model_validate(manifest["spec"])
    assert (spec.slo.percentile, spec.hysteresis.slack_buffer_ms) == (99.0, 20.0)
    assert spec.threshold_model is ThresholdModel.PAPER_MEAN
    assert "p99 ms" in out
    assert "stay<=qps" not in out  # the paper's model has no rate limits


def test_plan_writes_the_strategy_and_admission_asked_for(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--strategy and the admission flags land in the manifest, which `compass simulate` then
    serves as that strategy with admission, with no hand edit."""
    argv = ["plan", "--profiles", "profiles.json", "--slo-ms", "1000", "--whole-workflow"]
    argv += ["--strategy", "predictive"]
    argv += ["--admission", "--degrade-after", "0.5", "--no-refuse"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the whole workflow switched by predictive, admission on" in out
    document = yaml.safe_load((workdir / "paretopolicy.yaml").read_text(encoding="utf-8"))["spec"]
    assert document["strategy"] == "predictive"
    assert document["admission"] == {
        "enabled": True,
        "quantile": 0.5,
        "degradeAfter": 0.5,
        "refuse": False,
    }
    spec = ParetoPolicySpec.model_validate(document)
    assert admission_rule(spec).degrade_after == 0.5
    simulate = ["simulate", "--policy", "paretopolicy.yaml", "--duration", "30", "--base-qps", "2"]
    assert main(simulate) == 0
    assert "admission q 0.5, refusing nothing" in capsys.readouterr().out


def test_a_manifest_that_still_sets_a_forecaster_is_told_it_was_removed(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy written before the forecasters left names the field and the fix."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "1000"]) == 0
    capsys.readouterr()
    path = workdir / "paretopolicy.yaml"
    manifest = yaml.safe_load(path.read_text(encoding="utf-8"))
    manifest["spec"]["forecaster"] = "lstm"
    path.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    assert main(["simulate", "--policy", "paretopolicy.yaml", "--duration", "30"]) == 2
    line = one_error_line(capsys, "simulate")
    assert "forecaster: removed" in line
    assert "delete the field" in line


def test_plan_writes_per_request_binding_by_default(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the flags the manifest keeps the CRD's defaults: each request bound at take-up,
    admission on, the lag cap; simulate serves it behind the gate and beside the oracle."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "1000"]) == 0
    assert "each request bound at take-up, admission on\n" in capsys.readouterr().out
    document = yaml.safe_load((workdir / "paretopolicy.yaml").read_text(encoding="utf-8"))["spec"]
    spec = ParetoPolicySpec.model_validate(document)
    assert spec.binding.mode is BindingMode.PER_REQUEST
    assert not spec.binding.stages
    assert spec.admits
    assert spec.binding.lag_share == 0.3
    assert "routing" not in document
    simulate = ["simulate", "--policy", "paretopolicy.yaml", "--pattern", "spike", "--seed", "4"]
    assert main([*simulate, "--oracle"]) == 0
    out = capsys.readouterr().out
    assert "each request bound at take-up, admission on, behind a gate of 8 instances" in out
    oracle = next(line for line in out.splitlines() if line.startswith("oracle"))
    assert "the policy's share of its accuracy gain:" in oracle
    summary = json.loads((workdir / "compass-timeline.json").read_text())["summary"]
    # Bound per request: no switch, and more accurate than static fastest on the same arrivals.
    assert summary["policy"]["switches"] == 0
    assert summary["policy"]["mean_accuracy"] > summary["fastest"]["mean_accuracy"]
    # What only whole-workflow serving has is refused, not ignored.
    assert main([*simulate, "--scrape-interval", "10"]) == 2
    assert "--scrape-interval: applies to whole-workflow serving" in capsys.readouterr().err


def test_plan_writes_stages_and_a_service_that_apply_without_an_edit(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--stage binds stage by stage; --service writes routing; bad stages name the flag."""
    argv = ["plan", "--profiles", "profiles.json", "--slo-ms", "1000", "--service", "triton"]
    stages = ["--stage", "retriever+ranker:k", "--stage", "generator:model"]
    assert main([*argv, *stages]) == 0
    assert "each request bound stage by stage (2 stages)" in capsys.readouterr().out
    document = yaml.safe_load((workdir / "paretopolicy.yaml").read_text(encoding="utf-8"))["spec"]
    spec = ParetoPolicySpec.model_validate(document)
    assert [stage.models for stage in spec.binding.stages] == [("retriever", "ranker"), "generator"]
    assert spec.routing is not None
    assert spec.routing.service == "triton"
    for bad, expected in (
        (["--stage", "generator"], "--stage: 'generator' is not MODEL:PARAM"),
        (["--stage", "generator:top_k"], "--stage: binding.stages[0].parameters: 'top_k'"),
        (["--whole-workflow", "--stage", "g:model"], "--stage: binds each request"),
        (["--strategy", "split"], "--strategy: split switches the whole workflow"),
        (["--service", "Triton_1"], "--service: 'Triton_1' is not a valid Kubernetes name"),
    ):
        assert main([*argv, *bad, "--output", "bad.yaml"]) == 2
        assert expected in one_error_line(capsys, "plan")


def test_plan_names_the_manifest_and_picks_its_format(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--name, --namespace and --format reach the manifest; without --name the file names it."""
    argv = ["plan", "--profiles", "profiles.json", "--slo-ms", "800"]
    extra = ["--name", "rag", "--namespace", "serving", "--format", "json", "--output", "p.out"]
    assert main([*argv, *extra]) == 0
    manifest = json.loads((workdir / "p.out").read_text())
    assert manifest["metadata"] == {"name": "rag", "namespace": "serving"}
    ParetoPolicySpec.model_validate(manifest["spec"])
    assert main([*argv, "--output", "My_Policy.v2.yaml"]) == 0
    named = yaml.safe_load((workdir / "My_Policy.v2.yaml").read_text())
    assert named["metadata"]["name"] == "my-policy.v2"
    capsys.readouterr()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--name", "Rag_Policy"), ("--name", "x-"), ("--namespace", "a.b"), ("--namespace", "X")],
)
def test_plan_refuses_a_name_kubernetes_would(
    workdir: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    argv = ["plan", "--profiles", "profiles.json", "--slo-ms", "800", flag, value]
    assert main(argv) == 2
    line = one_error_line(capsys, "plan")
    assert f"{flag}: {value!r} is not a valid Kubernetes name" in line
    assert not (workdir / "paretopolicy.yaml").exists()


def test_simulate_compares_the_policy_with_the_baselines(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four rows on the same arrivals, and a timeline with every tick and request."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--whole-workflow"]) == 0
    capsys.readouterr()
    code = main(
        [
            "simulate",
            "--policy",
            "paretopolicy.yaml",
            "--pattern",
            "spike",
            "--duration",
            "120",
            "--base-qps",
            "1.5",
            "--seed",
            "4",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    labels = [line.split()[0] for line in out.splitlines()[2:6]]
    assert labels == ["fastest", "middle", "accurate", "policy"]
    timeline = json.loads((workdir / "compass-timeline.json").read_text())
    summary = timeline["summary"]
    assert len({s["requests"] for s in summary.values()}) == 1  # paired
    requests = summary["policy"]["requests"]
    assert len(timeline["requests"]) == requests
    assert f"{requests} requests" in out
    assert len(timeline["ticks"]) >= 120
    assert {t["active"] for t in timeline["ticks"]} <= set(timeline["configurations"])
    assert len(timeline["switches"]) == summary["policy"]["switches"]
    assert summary["policy"]["switches"] > 0
    within = sum(r["latency_ms"] <= 800 for r in timeline["requests"])
    assert summary["policy"]["slo_compliance_pct"] == pytest.approx(100 * within / requests)


def test_simulate_serves_several_pods_with_a_switch_delay(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--pods splits the requests among pods (FIFO on each); the header says pods and delay."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--whole-workflow"]) == 0
    capsys.readouterr()
    argv = ["simulate", "--policy", "paretopolicy.yaml", "--duration", "60", "--base-qps", "3"]
    assert main([*argv, "--pods", "2", "--switch-delay-ms", "20"]) == 0
    out = capsys.readouterr().out
    assert "2 pod(s); " in out
    assert "1 router instance(s) (independent), switch delay 20 ms" in out
    two = json.loads((workdir / "compass-timeline.json").read_text())["summary"]
    assert main(argv) == 0
    one = json.loads((workdir / "compass-timeline.json").read_text())["summary"]
    # The same requests, served by two servers: less waiting on a static configuration.
    assert two["accurate"]["requests"] == one["accurate"]["requests"]
    assert two["accurate"]["p95_ms"] < one["accurate"]["p95_ms"]


def test_simulate_reads_the_queue_as_prometheus_scraped_it_when_asked(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--scrape-interval: the header says so and the policy's run changes; the baselines, which
    look at nothing, do not. Without it the header says nothing of a scrape."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--whole-workflow"]) == 0
    capsys.readouterr()
    argv = ["simulate", "--policy", "paretopolicy.yaml", "--pattern", "spike", "--seed", "4"]
    assert main(argv) == 0
    assert "scraped" not in capsys.readouterr().out
    fresh = json.loads((workdir / "compass-timeline.json").read_text())
    assert main([*argv, "--scrape-interval", "10", "--metrics-lag", "2"]) == 0
    out = capsys.readouterr().out
    assert "the policy reads the queue as scraped every 10 s, showing the pods 2 s before" in out
    scraped = json.loads((workdir / "compass-timeline.json").read_text())
    assert scraped["summary"]["fastest"] == fresh["summary"]["fastest"]
    assert scraped["ticks"] != fresh["ticks"]


def test_simulate_with_admission_drops_what_would_be_late_and_says_so(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--admission: the policy's routers drop under a spike what would be late; the baselines
    drop none; the timeline marks each dropped request and counts it as a miss."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--whole-workflow"]) == 0
    capsys.readouterr()
    argv = ["simulate", "--policy", "paretopolicy.yaml", "--pattern", "spike", "--seed", "4"]
    load = ["--duration", "120", "--base-qps", "3"]
    assert main([*argv, *load, "--admission"]) == 0
    out = capsys.readouterr().out
    assert "admission q 0.5" in out
    timeline = json.loads((workdir / "compass-timeline.json").read_text())
    summary = timeline["summary"]
    assert summary["policy"]["dropped_pct"] > 0
    assert all(summary[b]["dropped_pct"] == 0 for b in ("fastest", "middle", "accurate"))
    dropped = [r for r in timeline["requests"] if r["dropped"]]
    assert dropped
    assert all(r["configuration"] is None for r in dropped)
    within = sum(r["latency_ms"] <= 800 and not r["dropped"] for r in timeline["requests"])
    requests = summary["policy"]["requests"]
    assert summary["policy"]["slo_compliance_pct"] == pytest.approx(100 * within / requests)
    assert main([*argv, *load]) == 0
    plain = json.loads((workdir / "compass-timeline.json").read_text())["summary"]["policy"]
    assert plain["dropped_pct"] == 0
    assert summary["policy"]["slo_compliance_pct"] > plain["slo_compliance_pct"]
    # A policy with admission.enabled is simulated with it, at its own quantile.
    policy = yaml.safe_load((workdir / "paretopolicy.yaml").read_text())
    policy["spec"]["admission"] = {"enabled": True, "quantile": 0.7}
    (workdir / "paretopolicy.yaml").write_text(yaml.safe_dump(policy))
    assert main([*argv, *load]) == 0
    assert "admission q 0.7" in capsys.readouterr().out
    # Refusing nothing (the flag, or the policy's admission.refuse: false): none dropped.
    assert main([*argv, *load, "--no-refuse"]) == 0
    assert "admission q 0.7, refusing nothing" in capsys.readouterr().out
    kept = json.loads((workdir / "compass-timeline.json").read_text())["summary"]["policy"]
    assert kept["dropped_pct"] == 0
    policy["spec"]["admission"]["refuse"] = False
    (workdir / "paretopolicy.yaml").write_text(yaml.safe_dump(policy))
    assert main([*argv, *load]) == 0
    assert "refusing nothing" in capsys.readouterr().out


def test_a_policy_of_several_router_instances_plans_and_simulates_them(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--router-instances goes into the policy; simulate serves that many at once per pod."""
    plan = ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--model", "erlang-c"]
    plan += ["--whole-workflow"]
    assert main([*plan, "--router-instances", "4", "--output", "four.yaml"]) == 0
    assert main([*plan, "--output", "one.yaml"]) == 0
    out = capsys.readouterr().out
    assert "qps: the same for the arrival rate (M/G/c, Erlang C)" in out
    four_spec = yaml.safe_load((workdir / "four.yaml").read_text())["spec"]
    four = ParetoPolicySpec.model_validate(four_spec)
    one = ParetoPolicySpec.model_validate(
        yaml.safe_load((workdir / "one.yaml").read_text())["spec"]
    )
    assert four.router_instances == 4
    fast_four, fast_one = policy_plan(four).thresholds[0], policy_plan(one).thresholds[0]
    assert fast_four.stay_max_qps is not None
    assert fast_one.stay_max_qps is not None
    assert fast_four.stay_max_qps > 3 * fast_one.stay_max_qps
    load = ["--duration", "60", "--base-qps", "6", "--pattern", "constant"]
    summaries = {}
    runs = (
        ("four", "independent"),
        ("one", "independent"),
        ("four", "rag-sim"),
        ("four", "contended"),
    )
    for name, stages in runs:
        argv = ["simulate", "--policy", f"{name}.yaml", *load, "--stages", stages]
        assert main(argv) == 0
        header = capsys.readouterr().out.splitlines()[0]
        assert f"{4 if name == 'four' else 1} router instance(s) ({stages})" in header
        timeline = json.loads((workdir / "compass-timeline.json").read_text())
        summaries[name, stages] = timeline["summary"]["accurate"]
    # Six requests/s at 250 ms: over one server's capacity, within four's; the pipeline of
    # one-instance stages serves between the two.
    p95 = {key: summary["p95_ms"] for key, summary in summaries.items()}
    assert p95["four", "independent"] < p95["four", "rag-sim"] < p95["one", "independent"]
    # Without a capacity curve four contended instances share the pod as one (slot_stretch,
    # the rule binding's slots are judged by): over its capacity, as one server is.
    assert p95["four", "contended"] == pytest.approx(p95["one", "independent"], rel=0.05)
    bad = ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--router-instances", "0"]
    assert main(bad) == 2
    assert "--router-instances" in one_error_line(capsys, "plan")


def test_plots_are_written(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--plot draws PNG files for both commands; a whole ParetoPolicy manifest is accepted."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--plot", "f.png"]) == 0
    spec = yaml.safe_load((workdir / "paretopolicy.yaml").read_text())["spec"]
    manifest = {"apiVersion": "compass.io/v1alpha1", "kind": "ParetoPolicy", "spec": spec}
    (workdir / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    code = main(
        ["simulate", "--policy", "manifest.yaml", "--duration", "60", "--plot", "timeline.png"]
    )
    assert code == 0, capsys.readouterr().err
    for name in ("f.png", "timeline.png"):
        assert (workdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------- bad input


def write_profiles(workdir: Path, profiles: Any) -> None:
    (workdir / "profiles.json").write_text(json.dumps(profiles), encoding="utf-8")


@pytest.mark.parametrize(
    ("profiles", "args", "expected"),
    [
        (
            [{k: v for k, v in PROFILES[0].items() if k != "latency_p95_ms"}],
            [],
            "profiles[0].latency_p95_ms: missing",
        ),
        (
            [dict(PROFILES[0], latency_mean_ms=-5)],
            [],
            "profiles[0].latency_mean_ms: -5 is negative",
        ),
        (
            [PROFILES[0], dict(PROFILES[2], latency_p99_ms=-1.0)],
            [],
            "profiles[1].latency_p99_ms: -1 is negative",
        ),
        ({"profiles": []}, [], "no profiles, so the Pareto front is empty"),
        ([], [], "no profiles, so the Pareto front is empty"),
        (PROFILES, ["--slo-ms", "100"], "--slo-ms: 100 ms is below every configuration's p95"),
        (PROFILES, ["--slo-ms", "fast"], "--slo-ms: 'fast' is not a number"),
        (PROFILES, ["--slo-ms", "-3"], "--slo-ms: -3 is not > 0"),
        (PROFILES, ["--percentile", "100"], "--percentile: 100 is not below 100"),
        (PROFILES, ["--slack-ms", "-1"], "--slack-ms: -1 is not >= 0"),
        (PROFILES, ["--output", "missing/dir/p.yaml"], "--output: directory missing/dir"),
        (PROFILES, ["--output", "profiles.json"], "--output: profiles.json is also --profiles"),
        (PROFILES, ["--model", "magic"], "argument --model: invalid choice"),
        (PROFILES, ["--strategy", "greedy"], "argument --strategy: invalid choice"),
        (
            PROFILES,
            ["--whole-workflow", "--no-refuse"],
            "--no-refuse: only applies with admission",
        ),
        (
            PROFILES,
            ["--no-admission", "--degrade-after", "0.5"],
            "--degrade-after: only applies with admission",
        ),
        (
            PROFILES,
            ["--admission", "--admission-quantile", "1"],
            "--admission-quantile: 1 is not < 1",
        ),
        (PROFILES, ["--admission", "--degrade-after", "2"], "--degrade-after: 2 is not <= 1"),
    ],
)
def test_plan_bad_input_is_one_line_and_exit_2(
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    profiles: Any,
    args: list[str],
    expected: str,
) -> None:
    """Each bad input names the field; nothing is written."""
    write_profiles(workdir, profiles)
    argv = ["plan", "--profiles", "profiles.json", "--slo-ms", "1000", *args]
    before = (workdir / "profiles.json").read_bytes()
    assert main(argv) == 2
    assert expected in one_error_line(capsys, "plan")
    assert not (workdir / "paretopolicy.yaml").exists()
    assert (workdir / "profiles.json").read_bytes() == before


def test_plan_slo_error_names_the_closest_configuration(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SLO error says which configuration comes closest and by how much."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "110"]) == 2
    line = one_error_line(capsys, "plan")
    fastest_p95 = 100 + 1.645 * 15
    assert (
        f"the closest, fast/3, has {fastest_p95:.1f} ms ({fastest_p95 - 110:.1f} ms over)" in line
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("{not json", "line 1, column 2: not valid JSON"), (None, "no such file")],
)
def test_plan_unreadable_profiles(
    workdir: Path, capsys: pytest.CaptureFixture[str], text: str | None, expected: str
) -> None:
    """A file that is not JSON, or no file at all: one line naming --profiles."""
    if text is None:
        (workdir / "profiles.json").unlink()
    else:
        (workdir / "profiles.json").write_text(text)
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "1000"]) == 2
    line = one_error_line(capsys, "plan")
    assert "--profiles" in line
    assert expected in line


@pytest.fixture
def policy(workdir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """A valid policy spec, as parsed YAML (a bare spec is accepted as well as a manifest)."""
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "800"]) == 0
    capsys.readouterr()
    loaded: dict[str, Any] = yaml.safe_load((workdir / "paretopolicy.yaml").read_text())["spec"]
    return loaded


@pytest.mark.parametrize(
    ("change", "args", "expected"),
    [
        (
            {"hysteresis": {"downscaleCooldownSeconds": -1}},
            [],
            "hysteresis.downscaleCooldownSeconds",
        ),
        ({"surprise": 1}, [], "surprise"),
        ({"front": []}, [], "front"),
        ({"slo": {"latencyMs": 50}}, [], "slo.latencyMs: 50 ms is below every configuration"),
        ({"thresholdModel": "guess"}, [], "thresholdModel"),
        ({}, ["--pattern", "trace"], "--trace"),
        ({}, ["--base-qps", "0"], "--base-qps: 0 is not > 0"),
        ({}, ["--duration", "x"], "--duration: 'x' is not a number"),
        ({}, ["--seed", "one"], "--seed: 'one' is not an integer"),
        ({}, ["--pods", "0"], "--pods: 0 is not >= 1"),
        ({}, ["--pods", "1.5"], "--pods: 1.5 is not a whole number"),
        ({}, ["--switch-delay-ms", "-3"], "--switch-delay-ms: -3 is not >= 0"),
        ({}, ["--scrape-interval", "-1"], "--scrape-interval: -1 is not >= 0"),
        ({}, ["--metrics-lag", "nan"], "--metrics-lag"),
        ({}, ["--admission", "--admission-quantile", "1"], "--admission-quantile: 1 is not < 1"),
        ({}, ["--admission", "--admission-quantile", "0"], "--admission-quantile: 0 is not > 0"),
        ({}, ["--admission", "--degrade-after", "1.5"], "--degrade-after: 1.5 is not <= 1"),
        ({}, ["--admission", "--degrade-after", "0"], "--degrade-after: 0 is not > 0"),
    ],
)
def test_simulate_bad_input_is_one_line_and_exit_2(
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    policy: dict[str, Any],
    change: dict[str, Any],
    args: list[str],
    expected: str,
) -> None:
    """A bad policy or load setting names the field; nothing is simulated or written."""
    policy.update(change)
    (workdir / "bad.yaml").write_text(yaml.safe_dump(policy))
    assert main(["simulate", "--policy", "bad.yaml", *args]) == 2
    assert expected in one_error_line(capsys, "simulate")
    assert not (workdir / "compass-timeline.json").exists()


def test_simulate_replays_a_trace_file(
    workdir: Path, capsys: pytest.CaptureFixture[str], policy: dict[str, Any]
) -> None:
    """--pattern trace --trace FILE serves exactly the trace's arrivals; a bad line is refused."""
    (workdir / "trace.txt").write_text("\n".join(str(0.25 * i) for i in range(200)))
    argv = ["simulate", "--policy", "paretopolicy.yaml", "--pattern", "trace", "--trace"]
    assert main([*argv, "trace.txt"]) == 0
    assert "200 requests" in capsys.readouterr().out
    (workdir / "trace.txt").write_text("0.1\nsoon\n")
    assert main([*argv, "trace.txt"]) == 2
    assert "entry 2 ('soon') is not a number" in one_error_line(capsys, "simulate")


def test_simulate_serves_a_window_of_a_production_trace_at_a_utilisation(
    workdir: Path, capsys: pytest.CaptureFixture[str], policy: dict[str, Any]
) -> None:
    """--trace-name cuts a window of a shipped trace and stretches it to --utilisation of the
    fastest member's capacity: the same window at a higher utilisation is the same arrivals,
    faster; a window past the trace's end or with --pattern is refused naming the flag."""
    argv = ["simulate", "--policy", "paretopolicy.yaml", "--trace-name", "azure-llm-conv-2023"]
    argv += ["--window-start", "600", "--window-s", "300"]
    requests = {}
    for utilisation in ("0.3", "0.9"):
        assert main([*argv, "--utilisation", utilisation]) == 0
        header = capsys.readouterr().out.splitlines()[0]
        assert "azure-llm-conv-2023 from 600 s, stretched to " + utilisation in header
        requests[utilisation] = header
    counts = {u: int(h.split(" requests")[0].rsplit(" ", 1)[-1]) for u, h in requests.items()}
    assert counts["0.3"] == counts["0.9"] > 0  # the window's arrivals, whatever the stretch
    rates = {u: float(h.split("base ")[1].split(" QPS")[0]) for u, h in requests.items()}
    assert rates["0.9"] == pytest.approx(3 * rates["0.3"], rel=0.02)
    assert main([*argv[:-4], "--window-start", "3400"]) == 2
    assert "--window-start: the window [3400, 4000) s ends after" in one_error_line(
        capsys, "simulate"
    )
    assert main([*argv, "--pattern", "ramp"]) == 2
    assert "--trace-name: is a load of its own" in one_error_line(capsys, "simulate")


# ---------------------------------------------------------------------------- the spec model


def test_every_policy_spec_field_is_described_and_camel_case() -> None:
    """The CRD generator needs a description on every field; the wire format is camelCase."""
    schema = ParetoPolicySpec.model_json_schema(by_alias=True)
    models = [schema, *schema.get("$defs", {}).values()]
    checked = 0
    for model in models:
        for name, field in model.get("properties", {}).items():
            assert field.get("description"), f"{model.get('title')}.{name} has no description"
            assert "_" not in name, name
            checked += 1
    assert checked >= 25
    entry = {"config": {"a": 1}, "accuracy": 0.5, "latencyMeanMs": 10, "latencyP95Ms": 12}
    spec = ParetoPolicySpec.model_validate({"front": [entry], "slo": {"latencyMs": 900}})
    assert spec.hysteresis.downscale_cooldown_seconds == 5.0
    assert spec.on_metrics_loss.value == "fastest"
    assert spec.interval_seconds == 1.0
    assert spec.metrics is None
    with pytest.raises(ValueError, match="same configuration"):
        ParetoPolicySpec.model_validate(
            {"front": [spec.front[0].model_dump(by_alias=True)] * 2, "slo": {"latencyMs": 900}}
        )
