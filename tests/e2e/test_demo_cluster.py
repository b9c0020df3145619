"""`compass demo --cluster` as a user runs it: the example workflow through the operator on a local
real API server, shrunk (10 profiling requests a configuration; the default 180 s spike at a tenth
of rag-sim's latency, 18 s a run), from another directory than the checkout with a relative
--output-dir, and interrupted with Ctrl-C part way, which must leave nothing running. The example
serves with late binding (the routers bind each request from the operator's table); once more
with --whole-workflow (a 90 s spike), the operator's Elastico switching the whole workflow.

The demo starts its own control plane, Triton (and Prometheus with --queue-from prometheus) and
operator, so this module uses no fixture of the tiers but their skip reasons: no control plane,
no tritonserver (failures instead under COMPASS_REQUIRE_TIERS=1, see tests/tiers.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from compass.api.paretopolicy import ParetoPolicySpec
from compass_dev.clusterdemo_setup import ClusterDemoSettings
from compass_dev.devcluster import Binaries
from tiers import require_tritonserver

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 8


def demo_argv(out: Path, *extra: str) -> list[str]:
    """The shrunk demo's command line."""
    return [
        *(
            sys.executable,
            "-m",
            "compass.commands.main",
            "demo",
            "--cluster",
            "--output-dir",
            str(out),
        ),
        *("--profile-runs", "10", *extra),
    ]


def processes_under(folder: Path, but: int | None = None) -> list[str]:
    """Live processes that name folder in their command line, environment (the operator's
    KUBECONFIG) or working directory (the pods'): every child the demo starts does."""
    found = []
    needle = str(folder).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), but):
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd").encode()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(needle in text for text in (argv, environ, cwd)):
            command = argv.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {command}")
    return found


@pytest.fixture(scope="module")
def runnable(k8s_binaries: Binaries) -> None:
    """The k8s tier's binaries (its skip reason) and a tritonserver."""
    require_tritonserver()


@pytest.fixture(scope="module")
def demo(
    runnable: None, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path, float]:
    """One shrunk run from a folder of its own, --output-dir relative: result, folder, wall time."""
    cwd = tmp_path_factory.mktemp("cluster-demo")
    started = time.monotonic()
    done = subprocess.run(
        demo_argv(Path("out")), cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    return done, cwd / "out", time.monotonic() - started


def test_the_demo_runs_every_step_and_writes_its_files(
    demo: tuple[subprocess.CompletedProcess[str], Path, float],
) -> None:
    done, out, took = demo
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for step in range(1, STEPS + 1):
        assert f"[{step}/{STEPS}] " in done.stdout
    # The workflow went through the operator's phases, shown by `kubectl get cwf,pp`.
    lines = done.stdout.splitlines()
    seen = [line.split()[1] for line in lines if line.strip().startswith("phase ")]
    assert [p for p in seen if p in ("Searching", "Profiling", "Ready")] == [
        "Searching",
        "Profiling",
        "Ready",
    ], seen
    assert "paretopolicy.compass.io/rag-sim" in done.stdout
    for name in ("timeline.png", "front.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    for name in ("profiles.json", "search-result.json", "comparison.json"):
        assert json.loads((out / name).read_text())
    # What was applied is the example with the adaptations it printed, and the policy is the
    # operator's, owned by the workflow.
    applied = yaml.safe_load((out / "workflow.yaml").read_text())
    assert applied["spec"]["evaluation"]["evaluator"]["type"] == "replay"
    # The example's 1000 ms SLO at the demo's default time scale (rag-sim's latencies with it).
    scale = ClusterDemoSettings(out).time_scale
    assert applied["spec"]["slo"]["latencyMs"] == pytest.approx(1000.0 * scale)
    assert applied["spec"]["profiling"]["measuredRuns"] == 10
    policy = yaml.safe_load((out / "policy.yaml").read_text())
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "CompoundWorkflow"
    assert len(ParetoPolicySpec.model_validate(policy["spec"]).front) >= 2
    assert processes_under(out) == [], "the demo left processes running"
    print(f"compass demo --cluster took {took:.0f} s")


@pytest.fixture(scope="module")
def whole_demo(
    runnable: None, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One shrunk run with --whole-workflow (a 90 s spike: half the requests): result, folder."""
    out = tmp_path_factory.mktemp("cluster-demo-whole") / "out"
    done = subprocess.run(
        demo_argv(out, "--whole-workflow", "--duration", "90"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done, out


def test_the_operator_beats_the_static_most_accurate_configuration(
    whole_demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """--whole-workflow: the example without its late binding, the operator's Elastico
    switching the whole workflow, against the same static ends."""
    done, out = whole_demo
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for step in range(1, STEPS + 1):
        assert f"[{step}/{STEPS}] " in done.stdout
    policy = yaml.safe_load((out / "policy.yaml").read_text())["spec"]
    assert ParetoPolicySpec.model_validate(policy).binding.mode.value == "workflow"
    comparison = json.loads((out / "comparison.json").read_text())
    runs = {row["run"]: row for row in comparison["runs"]}
    assert list(runs) == ["static fastest", "static most accurate", "Elastico (operator)"]
    operator, accurate = runs["Elastico (operator)"], runs["static most accurate"]
    fastest = runs["static fastest"]
    assert operator["failed"] == accurate["failed"] == fastest["failed"] == 0
    assert operator["switches"] >= 1
    assert len(comparison["switches"]) == operator["switches"]
    assert accurate["switches"] == fastest["switches"] == 0
    # The same spike with the fastest configuration pinned is in the table and the summary, as
    # in the local demo: the operator's accuracy is read against it.
    for title in ("static fastest", "static most accurate", r"Elastico \(operator\)"):
        assert re.search(rf"^  {title} +\d+\.\d% ", done.stdout, re.MULTILINE), title
    [summary] = [line for line in done.stdout.splitlines() if line.startswith("the operator met")]
    said = re.fullmatch(
        r"the operator met the SLO for ([\d.]+)% of requests \(static most accurate: ([\d.]+)%\) "
        r"at accuracy ([\d.]+) \(served ([\d.]+)\) "
        r"\(static fastest: ([\d.]+) \(served ([\d.]+)\)\)",
        summary,
    )
    assert said, summary
    shown = [float(v) for v in said.groups()]
    # Percentages to 0.1 (comparison.json keeps 0.01), accuracies to 0.0001 (as it keeps them).
    assert shown[:2] == pytest.approx(
        [operator["compliance_pct"], accurate["compliance_pct"]], abs=0.051
    )
    assert shown[2:] == pytest.approx(
        [
            operator["accuracy"],
            operator["served_accuracy"],
            fastest["accuracy"],
            fastest["served_accuracy"],
        ],
        abs=1e-4,
    )
    assert fastest["accuracy"] < accurate["accuracy"]
    # The spike must overload the most accurate configuration, or the comparison proves nothing.
    assert accurate["compliance_pct"] < 100.0
    assert operator["compliance_pct"] > accurate["compliance_pct"]
    assert comparison["adaptations"]
    assert comparison["metrics"]["type"] in ("prometheus", "triton")
    assert processes_under(out) == [], "the demo left processes running"


def test_late_binding_reaches_the_routers_through_the_operator_and_binds_each_request(
    demo: tuple[subprocess.CompletedProcess[str], Path, float],
) -> None:
    """The example's serving, the default: per-request binding reaches the ParetoPolicy, the
    operator's table the gated router (read back from it), and the router binds each request
    on its own: several front
    members serve the same spike, none fails, and it keeps the SLO far better than the static
    most accurate; the policy's status counts what the routers served (`kubectl get pp`)."""
    done, out, _ = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    policy = ParetoPolicySpec.model_validate(
        yaml.safe_load((out / "policy.yaml").read_text())["spec"]
    )
    assert policy.binding.mode.value == "per-request"
    assert (policy.binding.lag_share, policy.binding.lag_reserve) == (0.3, 2)
    assert policy.admits
    # The profiling Job timed every component of every front member: the table is split by them.
    for entry in policy.front:
        assert entry.component_ms is not None
        assert set(entry.component_ms) == {"retriever", "reranker", "generator"}
    held = [line for line in done.stdout.splitlines() if "the router holds" in line]
    assert len(held) == 1, done.stdout
    assert "one stage (the whole configuration, bound at take-up)" in held[0]
    assert "lag cap 0.3 (reserve 2), no wait rule, refuse true" in held[0]
    # The static runs were served with the binding and admission off (the patch printed and
    # applied): behind the gate the routers would admit their requests, deadline or not.
    assert '"binding":{"mode":"workflow"},"admission":{"enabled":false}' in done.stdout
    comparison = json.loads((out / "comparison.json").read_text())
    runs = {row["run"]: row for row in comparison["runs"]}
    assert list(runs) == ["static fastest", "static most accurate", "late binding (operator)"]
    bound, fastest = runs["late binding (operator)"], runs["static fastest"]
    accurate = runs["static most accurate"]
    assert bound["failed"] == fastest["failed"] == accurate["failed"] == 0
    assert fastest["refused"] == accurate["refused"] == 0
    # Each request bound on its own: more than one front member served it, more accurately on
    # the whole than static fastest, and the spike no longer sinks the SLO as it does the most
    # accurate configuration's.
    [served] = [line for line in done.stdout.splitlines() if "requests bound to " in line]
    members = re.findall(r"#\d+ \d+", served.split("requests bound to ")[1].split(" refused")[0])
    assert len(members) >= 2, served
    assert bound["served_accuracy"] > fastest["served_accuracy"]
    assert 0 < bound["gap_share_pct"] < 100
    assert accurate["compliance_pct"] < 100.0
    assert bound["compliance_pct"] > accurate["compliance_pct"]
    # The binding simulator's prediction beside it, and issue 42's floor read out.
    assert bound["simulated_compliance_pct"] is not None
    assert "the simulator's late binding" in done.stdout
    assert re.search(r"issue 42's floor .* (met|not met)$", done.stdout, re.MULTILINE)
    # `kubectl get pp` right after the run: its SERVED column, from the routers' counters.
    header = next(line for line in done.stdout.splitlines() if " SERVED " in line)
    assert header.split().index("SERVED") == header.split().index("SLO") + 1


def test_ctrl_c_stops_everything_it_started(runnable: None, tmp_path: Path) -> None:
    """SIGINT to the demo alone (not its process group) once the operator runs: it cleans up."""
    out = tmp_path / "out"
    # A terminal's Ctrl-C: SIGINT at Python's default handler in the demo, even where this test
    # inherited SIGINT ignored (a CI harness started in the background by a shell without job
    # control), which Python keeps, and Ctrl-C would never arrive.
    argv = demo_argv(out)
    interactive = [
        argv[0],
        "-c",
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from compass.commands.main import main; sys.exit(main(sys.argv[1:]))",
        *argv[3:],
    ]
    process = subprocess.Popen(
        interactive, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith(f"[5/{STEPS}]"):
            break
    # The cluster, Triton and the operator are up (the demo itself aside).
    assert len(processes_under(out, but=process.pid)) >= 5, "".join(seen)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 130, "".join(seen) + rest
    assert processes_under(out) == []


def test_the_control_plane_starts_from_another_directory_with_a_relative_workdir(
    k8s_binaries: Binaries, tmp_path: Path
) -> None:
    """`hack/k8s/start.sh --workdir k8s` from elsewhere: the API server runs in the workdir."""
    cwd = tmp_path.resolve()
    argv = [sys.executable, "-m", "compass_dev.devcluster", "--workdir", "k8s", "--no-node"]
    process = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    seen = []
    try:
        for line in process.stdout:
            seen.append(line)
            if line.startswith("Ctrl-C stops it."):
                break
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    shown = "".join(seen) + rest
    assert f"export KUBECONFIG={cwd / 'k8s' / 'kubeconfig'}" in shown, shown
    assert process.returncode == 0, shown
    assert processes_under(cwd) == []
