"""`compass demo` as a user runs it: the whole method against a real local Triton, shrunk.

A shorter search (budgets 10,20), fewer profiling requests, a 60 s spike at a tenth of rag-sim's
latency, every run --runs offers: the same steps and files as the default run, in about a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from compass.api.paretopolicy import ParetoPolicySpec
from tiers import require_tritonserver

TAU = 0.8
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# A live run this far below its own simulation was starved by something else on the machine
# (CI once saw static fastest at 83% and Elastico at 28%, each simulated at 100%).
DISTURBED_POINTS = 20


def _run_demo(out: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        *(sys.executable, "-m", "compass.commands.main", "demo", "--output-dir", str(out)),
        *("--tau", str(TAU), "--budgets", "10,20", "--time-scale", "0.1"),
        *("--duration", "60", "--profile-runs", "8"),
        *("--runs", "default,fastest,accurate,elastico,predictive"),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def _disturbed(out: Path) -> list[str]:
    """The runs whose live compliance fell far below their simulated compliance."""
    path = out / "comparison.json"
    if not path.exists():
        return []
    return [
        r["run"]
        for r in json.loads(path.read_text())["runs"]
        if r["simulated_compliance_pct"] is not None
        and r["simulated_compliance_pct"] - r["compliance_pct"] > DISTURBED_POINTS
    ]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One shrunk demo run (a second, once, if a busy machine starved the first)."""
    require_tritonserver()
    out = tmp_path_factory.mktemp("demo") / "out"
    done = _run_demo(out)
    if _disturbed(out):
        # A real fault repeats and still fails below; a neighbour's burst rarely hits twice.
        out = tmp_path_factory.mktemp("demo-again") / "out"
        done = _run_demo(out)
    return done, out


def test_demo_runs_every_step_and_writes_its_files(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    for step in range(1, 7):
        assert f"[{step}/6] " in done.stdout
    # Off the paper's knife edge (77%), where the simulator can predict a single live run.
    assert "(peak at 65% of the fastest configuration's capacity)" in done.stdout
    for name in ("timeline.png", "front.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    for name in ("comparison.json", "policy.yaml", "profiles.json", "search-result.json"):
        assert (out / name).stat().st_size > 0
    assert (out / "search.ledger.jsonl").read_text().count("\n") > 0


def test_the_front_uses_each_feasible_configurations_accuracy_on_every_sample(
    demo: tuple[subprocess.CompletedProcess[str], Path], rag_sim_data: dict[str, Any]
) -> None:
    """The search stops early; the profiles carry the mean over all 100 of rag-sim's scores."""
    _, out = demo
    profiles = json.loads((out / "profiles.json").read_text())["profiles"]
    assert profiles
    for profile in profiles:
        scores = rag_sim_data["configs"][json.dumps(profile["config"], sort_keys=True)]["scores"]
        assert profile["accuracy"] == pytest.approx(float(np.mean(scores)), abs=1e-9)


def test_the_profiles_and_the_written_policy_agree(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = demo
    profiles = json.loads((out / "profiles.json").read_text())
    result = json.loads((out / "search-result.json").read_text())
    assert len(profiles["profiles"]) == len(result["feasible"])
    assert profiles["metadata"]["time_scale"] == 0.1
    measured = [p for p in profiles["profiles"] if not p.get("screened")]
    assert all(p["measurement_runs"] == 8 for p in measured)
    manifest = yaml.safe_load((out / "policy.yaml").read_text())
    assert (manifest["kind"], manifest["metadata"]["name"]) == ("ParetoPolicy", "rag")
    spec = ParetoPolicySpec.model_validate(manifest["spec"])
    front = {json.dumps(e.config, sort_keys=True) for e in spec.front}
    # Only fully measured configurations reach the front; the front is ordered by speed.
    assert front <= {json.dumps(p["config"], sort_keys=True) for p in measured}
    means = [e.latency_mean_ms for e in spec.front]
    assert means == sorted(means)
    assert spec.slo.latency_ms == 1000


def test_the_default_serving_binds_behind_the_gate_and_beats_the_most_accurate_static(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """The default serving (per-request binding behind the router's gate) keeps the SLO far
    better than the static most accurate, serves more accurately than the static fastest, and
    its line shows the simulator's prediction (conversion.simulate_serving) beside it."""
    done, out = demo
    comparison = json.loads((out / "comparison.json").read_text())
    runs = {r["run"]: r for r in comparison["runs"]}
    default, accurate, fastest = (
        runs["default (per-request)"],
        runs["static most accurate"],
        runs["static fastest"],
    )
    assert default["failed"] == 0
    assert default["compliance_pct"] > accurate["compliance_pct"] + 20
    # Bound request by request: some served by more accurate members than the fastest.
    assert fastest["served_accuracy"] < default["served_accuracy"] <= accurate["served_accuracy"]
    assert default["simulated_compliance_pct"] is not None
    assert default["simulated_accuracy"] is not None
    # The timeline and the switches are the default serving's: its policy switches beside it.
    assert comparison["switches_of"] == "default (per-request)"
    assert len(comparison["switches"]) == default["switches"]
    lines = [line for line in done.stdout.splitlines() if "within the SLO" in line]
    assert len(lines) == 5
    assert all("; simulator " in line for line in lines)
    assert "start tritonserver with rag-sim: the router (8 instances behind a gate of 1" in (
        done.stdout
    )
    assert "default (per-request) met the SLO for" in done.stdout


def test_elastico_beats_the_most_accurate_static_under_the_spike(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    comparison = json.loads((out / "comparison.json").read_text())
    runs = {r["run"]: r for r in comparison["runs"]}
    assert set(runs) == {
        "static fastest",
        "static most accurate",
        "Elastico",
        "predictive + admission",
        "default (per-request)",
    }
    assert all(r["failed"] == 0 for r in runs.values())
    # Only the runs whose requests get deadlines (from the gate) can have requests refused.
    judged = {"predictive + admission", "default (per-request)"}
    assert all(r["refused"] == 0 for name, r in runs.items() if name not in judged)
    elastico, accurate, fastest = (
        runs["Elastico"],
        runs["static most accurate"],
        runs["static fastest"],
    )
    # The spike overloads the most accurate configuration; Elastico, which starts on the
    # fastest, keeps the SLO far better. Whether it climbs at all depends on the queue this
    # machine lets it see (on an overloaded one it rightly stays on the fastest, 0 switches):
    # that it climbs when the queue allows and moves back under a spike is asserted in
    # tests/unit (the simulator) and tests/e2e (through the operator), not here.
    assert elastico["compliance_pct"] > accurate["compliance_pct"] + 20
    admitted = runs["predictive + admission"]
    assert admitted["compliance_pct"] > accurate["compliance_pct"] + 20
    assert admitted["simulated_compliance_pct"] is not None
    assert "predictive + admission met the SLO for" in done.stdout
    assert fastest["accuracy"] < accurate["accuracy"]
    # What served each request, by the members' profiled accuracies: a policy's lies between
    # the two static ends whatever questions each member drew.
    assert (
        fastest["served_accuracy"]
        <= min(elastico["served_accuracy"], admitted["served_accuracy"])
        <= max(elastico["served_accuracy"], admitted["served_accuracy"])
        <= accurate["served_accuracy"]
    )
    assert "Elastico met the SLO for" in done.stdout
    assert "(against static most accurate " in done.stdout
