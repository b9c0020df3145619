"""Audit of the `compass` command line (issue 15 part 8): each bad input is one line and exit 2."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from compass.commands.main import main
from compass.evaluators.ledger import LedgerLock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_inputs import PROFILES, SPACE_YAML, ledger_lines, write_jsonl

HUGE = "9" * 400


class Run(NamedTuple):
    """One in-process `compass` run."""

    code: int
    out: str
    err: str


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd holding space.yaml, replay.jsonl, profiles.json and policy.yaml."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE_YAML, encoding="utf-8")
    write_jsonl(tmp_path / "replay.jsonl", ledger_lines())
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": PROFILES}), encoding="utf-8")
    assert (
        main(["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--output", "policy.yaml"])
        == 0
    )
    return tmp_path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    """main(argv) with what it printed."""

    def run(argv: list[str]) -> Run:
        code = main(argv)
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def refused(run: Run, *needles: str) -> str:
    """Assert exit 2 and one stderr line holding every needle; return the line."""
    assert run.code == 2, run.err
    lines = run.err.splitlines()
    assert len(lines) == 1, run.err
    assert "Traceback" not in run.err + run.out
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def replay(path: Path, *lines: str) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


# ---------------------------------------------------------------------------- values


def test_a_non_ascii_parameter_name_in_a_replay_is_one_line(here: Path, cli: Any) -> None:
    """Without --space the space is inferred; a name it cannot hold is named, not a traceback."""
    replay(here / "r.jsonl", '{"config": {"\u00e9": 1}, "scores": [1]}')
    line = refused(cli(["search", "--replay", "r.jsonl", "--tau", "0.5"]), "--replay r.jsonl")
    assert "parameter name '\u00e9'" in line


def test_an_empty_config_in_a_replay_is_one_line(here: Path, cli: Any) -> None:
    """{"config": {}} sets no parameter: no space can be inferred from it."""
    replay(here / "r.jsonl", '{"config": {}, "scores": [1]}')
    refused(cli(["search", "--replay", "r.jsonl", "--tau", "0.5"]), "sets no parameters")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (f'{{"config": {{"k": {HUGE}}}, "scores": [1]}}', 'value of "k" is an integer of 400'),
        (f'{{"config": {{"k": 1}}, "samples": [{HUGE}], "scores": [1]}}', "index of 400 digits"),
        ('{"config": {"k": 1}, "samples": [1000000000000], "scores": [1]}', "10,000,000"),
    ],
    ids=["config-value", "sample-index", "sample-index-1e12"],
)
def test_huge_integers_in_a_replay_are_one_line(
    here: Path, cli: Any, line: str, needle: str
) -> None:
    """A 400-digit integer does not convert to a float; an index of 1e12 would allocate TiBs."""
    replay(here / "r.jsonl", line)
    refused(cli(["search", "--replay", "r.jsonl", "--tau", "0.5"]), "r.jsonl line 1", needle)


@pytest.mark.parametrize(
    ("values", "needle"),
    [("[1.0, .nan]", "nan"), ("[1.0, .inf]", "inf")],
)
def test_nan_and_inf_in_a_float_space_are_refused(
    here: Path, cli: Any, values: str, needle: str
) -> None:
    """A NaN value never equals itself: a space holding one is refused with the field named."""
    (here / "s.yaml").write_text(f"parameters:\n  - {{name: lr, type: float, values: {values}}}\n")
    argv = ["search", "--space", "s.yaml", "--command", "true", "--samples", "10", "--tau", "0.5"]
    refused(cli(argv), "--space s.yaml", "values", f"{needle}", "not a finite number")


def test_a_huge_integer_in_a_space_is_refused(here: Path, cli: Any) -> None:
    (here / "s.yaml").write_text(
        f"parameters:\n  - {{name: k, type: integer, values: [1, {HUGE}]}}\n"
    )
    argv = ["search", "--space", "s.yaml", "--command", "true", "--samples", "10", "--tau", "0.5"]
    refused(cli(argv), "--space s.yaml", "400 digits")


def test_a_huge_integer_in_profiles_is_refused(here: Path, cli: Any) -> None:
    text = (
        (here / "profiles.json")
        .read_text()
        .replace('"latency_std_ms": 15', f'"latency_std_ms": {HUGE}')
    )
    (here / "profiles.json").write_text(text)
    refused(
        cli(["plan", "--profiles", "profiles.json", "--slo-ms", "800"]), "--profiles", "400 digits"
    )


@pytest.mark.parametrize("value", ["1e308", "1e9"])
def test_an_slo_beyond_a_day_is_refused(here: Path, cli: Any, value: str) -> None:
    """1e308 ms overflowed the queue-depth limits into a traceback."""
    refused(
        cli(["plan", "--profiles", "profiles.json", "--slo-ms", value]), "--slo-ms", "86,400,000"
    )


def test_simulate_bounds_the_work_up_front(here: Path, cli: Any) -> None:
    """An hour at 1e4 QPS asked numpy for GiBs; the limit is said before anything is drawn."""
    argv = ["simulate", "--policy", "policy.yaml", "--duration", "3600", "--base-qps", "1e4"]
    refused(cli(argv), "--duration", "1,000,000", "--base-qps")


def test_simulate_bounds_the_duration_however_sparse(here: Path, cli: Any) -> None:
    """1e7 s at 1e-6 QPS is ten requests but 1e7 decision ticks: hours of simulation."""
    argv = ["simulate", "--policy", "policy.yaml", "--duration", "1e7", "--base-qps", "1e-6"]
    refused(cli(argv), "--duration", "86,400 s (a day)")


# ---------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["simulate", "--policy", "policy.yaml", "--seed", "-1"], ["--seed: -1 is below 0"]),
        (["simulate", "--policy", "policy.yaml", "--seed", HUGE], ["--seed: 400 digits"]),
        (["search", "--replay", "replay.jsonl", "--tau", "0.5", "--seed", HUGE], ["--seed"]),
        (
            ["search", "--replay", "replay.jsonl", "--tau", "x" + HUGE],
            ["--tau", "(401 characters)"],
        ),
        (["simulate", "--policy", "policy.yaml", "--pods", "1e300"], ["--pods", "1000"]),
    ],
    ids=["simulate-seed-negative", "simulate-seed-huge", "search-seed-huge", "tau-long", "pods"],
)
def test_flags_are_bounded_and_echoed_short(
    here: Path, cli: Any, argv: list[str], needles: list[str]
) -> None:
    """A seed is an integer in [0, 2**32); a long value is cut in the message, not echoed whole."""
    line = refused(cli(argv), *needles)
    assert len(line) < 300


def test_an_emoji_in_a_profile_name_on_an_ascii_terminal(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What stdout's encoding cannot show is escaped: the plan is printed, not a traceback."""
    text = (here / "profiles.json").read_text().replace('"fast"', '"fast\\ud83d\\ude00"')
    (here / "profiles.json").write_text(text)
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert main(["plan", "--profiles", "profiles.json", "--slo-ms", "800"]) == 0
    sys.stdout.flush()
    assert b"fast\\U0001f600" in raw.getvalue()


def test_a_json_file_is_read_as_json_only(here: Path, cli: Any) -> None:
    """A .json file that is not JSON was read as YAML, which accepts a trailing comma."""
    space = '{"parameters": [{"name": "lr", "type": "float", "values": [1e-3, 2e-3]}],}'
    (here / "s.json").write_text(space)
    argv = ["search", "--space", "s.json", "--command", "true", "--samples", "10", "--tau", "0.5"]
    refused(cli(argv), "--space s.json line 1, column", "not valid JSON")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["simulate", "--policy", "link.yaml", "--timeline", "policy.yaml"], "--timeline"),
        (["simulate", "--policy", "policy.yaml", "--plot", "link.yaml"], "--plot"),
        (
            ["simulate", "--policy", "policy.yaml", "--timeline", "t.json", "--plot", "t.json"],
            "--plot",
        ),
        (
            ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--plot", "profiles.json"],
            "--plot",
        ),
        (
            ["profile", "--triton", "x:1", "--result", "replay.jsonl", "--output", "replay.jsonl"],
            "--output",
        ),
        (
            ["search", "--replay", "replay.jsonl", "--tau", "0.5", "--output", "rlink.jsonl"],
            "--output",
        ),
    ],
    ids=[
        "timeline-policy-symlink",
        "plot-policy",
        "plot-timeline",
        "plan-plot",
        "profile",
        "search",
    ],
)
def test_an_output_never_overwrites_an_input(
    here: Path, cli: Any, argv: list[str], needle: str
) -> None:
    """Paths are compared resolved, so a symlink to an input is that input."""
    (here / "link.yaml").symlink_to("policy.yaml")
    (here / "rlink.jsonl").symlink_to("replay.jsonl")
    before = {p.name: p.read_bytes() for p in here.iterdir() if p.is_file()}
    refused(cli(argv), f"{needle}:", "is also")
    assert {p.name: p.read_bytes() for p in here.iterdir() if p.is_file()} == before


def test_serve_names_a_policy_that_plans_nothing(here: Path, cli: Any) -> None:
    """A policy whose SLO no member meets was a traceback from runtime_policy(spec)."""
    text = (here / "policy.yaml").read_text().replace("latencyMs: 800", "latencyMs: 5")
    (here / "p.yaml").write_text(text)
    argv = [
        "serve",
        "--policy",
        "p.yaml",
        "--triton",
        "localhost:1",
        "--metrics",
        "http://localhost:2/m",
    ]
    refused(cli(argv), "--policy p.yaml: slo.latencyMs")


def test_load_checks_slo_before_sending_anything(here: Path, cli: Any) -> None:
    """--slo-ms was parsed after the whole load had run."""
    refused(cli(["load", "--triton", "localhost:1", "--slo-ms", "soon"]), "--slo-ms")


# ---------------------------------------------------------------------------- truncated files


def test_a_truncated_replay_is_refused_unless_allowed(here: Path, cli: Any) -> None:
    """A replay cut mid-line ran on 26 of 27 configurations with only a log line."""
    data = (here / "replay.jsonl").read_bytes()
    (here / "replay.jsonl").write_bytes(data[:-30])
    before = (here / "replay.jsonl").read_bytes()
    argv = ["search", "--replay", "replay.jsonl", "--tau", "0.5"]
    refused(cli(argv), "--replay", "replay.jsonl line 27", "cut short", "--allow-truncated")
    assert cli([*argv, "--allow-truncated"]).code == 0
    assert (here / "replay.jsonl").read_bytes() == before


def test_resume_keeps_a_cut_short_last_line(here: Path, cli: Any) -> None:
    """The ledger's partial last line is moved to LEDGER.partial, never silently deleted."""
    argv = ["search", "--replay", "replay.jsonl", "--tau", "0.5", "--ledger", "run.jsonl"]
    assert cli(argv).code == 0
    ledger = here / "run.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    torn = lines[-1][:-20]
    ledger.write_bytes(b"".join(lines[:-1]) + torn)
    run = cli(["search", "--replay", "replay.jsonl", "--tau", "0.5", "--resume", "run.jsonl"])
    assert run.code == 0, run.err
    assert "run.jsonl.partial" in run.err
    assert (here / "run.jsonl.partial").read_bytes() == torn + b"\n"
    assert ledger.read_bytes().endswith(b"\n")


# ---------------------------------------------------------------------------- one ledger, one search


def test_a_second_search_on_a_held_ledger_is_refused(here: Path, cli: Any) -> None:
    """The lock names the ledger and its holder; the ledger is left as it was."""
    argv = ["search", "--replay", "replay.jsonl", "--tau", "0.5", "--ledger", "run.jsonl"]
    assert cli(argv).code == 0
    assert not (here / "run.jsonl.lock").exists()  # released at the end
    before = (here / "run.jsonl").read_bytes()
    held = LedgerLock(here / "run.jsonl")
    held.acquire()
    try:
        run = cli(["search", "--replay", "replay.jsonl", "--tau", "0.5", "--resume", "run.jsonl"])
    finally:
        held.release()
    refused(run, "--resume: run.jsonl is in use by another search", f"(pid {os.getpid()})")
    assert (here / "run.jsonl").read_bytes() == before


def test_a_running_search_holds_its_ledger(here: Path, cli: Any) -> None:
    """A real search process in flight: a second one on its ledger exits 2 naming its pid."""
    command = "sh -c 'sleep 300 & wait'"
    argv = ["search", "--space", "space.yaml", "--command", command, "--samples", "10"]
    package = str(Path(__file__).resolve().parents[2] / "operator")
    env = {**os.environ, "PYTHONPATH": package}
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compass.commands.main",
            *argv,
            "--tau",
            "0.5",
            "--ledger",
            "l.jsonl",
        ],
        cwd=here,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (here / "l.jsonl").exists() or not (here / "l.jsonl.lock").read_text().strip():
            assert first.poll() is None, "the search ended before it held its ledger"
            assert time.monotonic() < deadline, "the search never started"
            time.sleep(0.05)
        second = cli([*argv, "--tau", "0.5", "--resume", "l.jsonl"])
        refused(second, "--resume: l.jsonl is in use by another search", f"(pid {first.pid})")
    finally:
        first.terminate()
        first.wait(timeout=60)


def test_simulate_refuses_a_load_with_no_request(here: Path, cli: Any) -> None:
    """0 requests were reported as 100% compliance; now nothing is simulated and it says so."""
    argv = ["simulate", "--policy", "policy.yaml", "--duration", "1", "--base-qps", "0.001"]
    refused(cli(argv), "--duration/--base-qps", "no request arrives", "raise --duration")
    assert not (here / "compass-timeline.json").exists()


@pytest.mark.parametrize("span", ["1e12", "1e300"])
def test_a_trace_spanning_ages_is_refused(here: Path, cli: Any, span: str) -> None:
    """Binning a 1e12 s trace asked numpy for terabytes; 1e300 s ticked without end."""
    (here / "trace.txt").write_text(f"0\n{span}\n", encoding="utf-8")
    argv = ["simulate", "--policy", "policy.yaml", "--pattern", "trace", "--trace", "trace.txt"]
    refused(cli(argv), "--trace", "spans", "a day")


def test_a_binary_trace_is_refused(here: Path, cli: Any) -> None:
    (here / "trace.txt").write_bytes(bytes(range(256)))
    argv = ["simulate", "--policy", "policy.yaml", "--pattern", "trace", "--trace", "trace.txt"]
    refused(cli(argv), "--trace", "not UTF-8")
