"""The `compass` command line: search from a replay ledger or a command, resume, demo, errors."""

from __future__ import annotations

import io
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from cli_inputs import SPACE_YAML, N, accuracy, ledger_lines, space_configs, write_jsonl

from compass.commands.demo import demo_ledger
from compass.commands.main import main
from compass.domain.space import Space, config_key
from compass.evaluators.ledger import read_ledger
from compass.examples import load_rag_paper, replay_scores
from compass_dev.experiment import ADMITTED_RUN, BINDING_RUN
from compass_dev.localdemo import parse_runs

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULT_KEYS = {"feasible", "evaluated", "sample_evals", "configs_evaluated"}


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def search_args(*extra: str) -> list[str]:
    """`compass search` on the inputs fixture's space and replay ledger, then extra."""
    return ["search", "--space", "space.yaml", "--replay", "ledger.jsonl", *extra]


def live_args(command: str, samples: str) -> list[str]:
    """`compass search` scoring with command on the inputs fixture's space, at tau 0.8."""
    return [
        "search",
        "--space",
        "space.yaml",
        "--tau",
        "0.8",
        "--command",
        command,
        "--samples",
        samples,
    ]


def reused(count: int, checkpoint: str) -> str:
    """What a resumed search says on stderr about the evaluations it took from its checkpoint."""
    return f"reused {count:,} sample evaluations from {checkpoint}"


class Outcome(NamedTuple):
    """One in-process `compass` run: its exit code and what it printed."""

    code: int
    out: str
    err: str


Cli = Callable[[list[str]], Outcome]


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory (the cwd) holding space.yaml and ledger.jsonl for the synthetic space."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE_YAML, encoding="utf-8")
    write_jsonl(tmp_path / "ledger.jsonl", ledger_lines())
    return tmp_path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Runs main(argv) and returns its exit code with the stdout and stderr of that run alone."""

    def run(argv: list[str]) -> Outcome:
        code = main(argv)
        out, err = capsys.readouterr()
        return Outcome(code, out, err)

    return run


def test_help_exits_zero(cli: Cli) -> None:
    """--help prints usage and succeeds."""
    run = cli(["search", "--help"])
    assert run.code == 0
    assert "--replay" in run.out


def imported_by(*argv: str) -> set[str]:
    """The top-level packages and compass modules a fresh `compass ARGV` process imported."""
    script = (
        "import sys\n"
        "from compass.commands.main import main\n"
        "code = main(sys.argv[1:])\n"
        "print(' '.join(sorted(sys.modules)))\n"
        "sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split("\n")[-2].split())


HEAVY = {"kopf", "kubernetes", "tritonclient", "matplotlib", "prometheus_client"}


def test_a_subcommand_loads_only_what_it_needs() -> None:
    """The one lazy boundary: `compass --help` imports no subcommand's module and none of the
    heavy clients; a subcommand imports its own module and what it needs, not the others'."""
    listing = imported_by("--help")
    assert not {m for m in listing if m.startswith("compass.commands.")} - {"compass.commands.main"}
    assert not HEAVY & listing
    crds = imported_by("crds", "--help")
    assert "compass.commands.crds" in crds
    assert "compass.commands.operator" not in crds
    assert not HEAVY & crds
    operator = imported_by("operator", "--help")
    assert {"kopf", "kubernetes"} <= operator


# ---------------------------------------------------------------------------- replay


def test_replay_search_writes_result_and_ledger(inputs: Path, cli: Cli) -> None:
    """A replay search writes exactly the result keys, a checkpoint ledger and a summary."""
    run = cli(search_args("--tau", "0.8", "--output", "result.json"))
    assert run.code == 0, run.err
    assert run.err == ""  # not a terminal: no progress line, and nothing else to say
    result = read_json(inputs / "result.json")
    assert set(result) == RESULT_KEYS
    evaluated = result["evaluated"]
    assert result["configs_evaluated"] == len(evaluated)
    assert result["sample_evals"] == sum(e["samples"] for e in evaluated)
    assert {e["verdict"] for e in evaluated} <= {"feasible", "infeasible"}
    feasible = [
        {k: e[k] for k in ("config", "accuracy", "samples")}
        for e in evaluated
        if e["verdict"] == "feasible"
    ]
    assert sorted(map(json.dumps, feasible)) == sorted(map(json.dumps, result["feasible"]))
    accuracies = [f["accuracy"] for f in result["feasible"]]
    assert accuracies == sorted(accuracies, reverse=True)
    truth = {config_key(c) for c in space_configs() if accuracy(c) >= 0.8}
    assert {config_key(f["config"]) for f in result["feasible"]} == truth
    # The checkpoint sits next to the result and holds every evaluated sample.
    ledger = read_ledger(inputs / "result.ledger.jsonl")
    assert ledger.fact_count == result["sample_evals"]
    assert files(inputs) == {"space.yaml", "ledger.jsonl", "result.json", "result.ledger.jsonl"}
    for expected in (
        "tau 0.8, method compass-v, interval betting (confidence 0.95), budgets adaptive",
        "space: 27 configurations, 40 samples each",
        f"feasible: {len(truth)} found",
        f"evaluated: {len(evaluated)} of 27 configurations, {result['sample_evals']:,} sample",
        "savings: ",
        "(1,080 = 27 configurations x 40 samples)",
        "stopped: ",
        "result: result.json",
        "ledger: result.ledger.jsonl",
    ):
        assert expected in run.out
    assert len(run.out.splitlines()) <= 24  # one screen


def test_grid_method_evaluates_every_configuration(inputs: Path, cli: Cli) -> None:
    """--method grid --interval betting: all 27 configurations, in space order."""
    grid = ("--method", "grid", "--interval", "betting", "--budgets", "10,20,40")
    run = cli(search_args("--tau", "0.8", *grid, "--output", "grid.json"))
    assert run.code == 0
    assert read_json(inputs / "grid.json")["configs_evaluated"] == 27
    assert "method grid, interval betting" in run.out
    assert "budgets 10,20,40" in run.out


@pytest.mark.parametrize(
    ("extra", "checkpoint"),
    [
        pytest.param((), "compass-search.ledger.jsonl", id="default-in-the-cwd"),
        pytest.param(("--ledger", "ck.jsonl"), "ck.jsonl", id="explicit-ledger"),
    ],
)
def test_without_output_only_the_checkpoint_is_written(
    inputs: Path, cli: Cli, extra: tuple[str, ...], checkpoint: str
) -> None:
    """No --output: no result; the checkpoint is --ledger, else ./compass-search.ledger.jsonl."""
    run = cli(search_args("--tau", "0.7", *extra))
    assert run.code == 0
    assert files(inputs) == {"space.yaml", "ledger.jsonl", checkpoint}
    assert (inputs / checkpoint).stat().st_size > 0
    assert "result: not written" in run.out
    assert f"ledger: {checkpoint}" in run.out


def test_space_is_inferred_from_the_ledger_and_said_so(inputs: Path, cli: Cli) -> None:
    """No --space: the ledger's configurations span the space; stderr lists the parameters."""
    run = cli(["search", "--replay", "ledger.jsonl", "--tau", "0.8", "--output", "r.json"])
    assert run.code == 0
    assert "no --space given: inferred the space from the 27 configurations" in run.err
    assert "model (categorical): large, medium, small" in run.err
    assert "k (integer): 1, 2, 4, 8" in run.err
    assert "rerank (integer): 1, 2, 4" in run.err
    assert "space: 27 configurations" in run.out


def test_a_compound_workflow_manifest_is_accepted_as_space(inputs: Path, cli: Cli) -> None:
    """A CompoundWorkflow document: its spec.space is the space."""
    indented = "".join(f"    {line}\n" for line in SPACE_YAML.splitlines())
    (inputs / "workflow.yaml").write_text(
        f"kind: CompoundWorkflow\nspec:\n  space:\n{indented}", encoding="utf-8"
    )
    run = cli(["search", "--space", "workflow.yaml", "--replay", "ledger.jsonl", "--tau", "0.8"])
    assert run.code == 0, run.err


def test_progress_line_only_on_a_terminal(
    inputs: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    """On a TTY, one line redrawn in place with phase, configs/space, samples and feasible."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run = cli(search_args("--tau", "0.8"))
    assert run.code == 0
    drawn = terminal.getvalue()
    assert drawn.startswith("\r\x1b[K")
    assert "\n" not in drawn  # redrawn in place, never scrolled
    assert drawn.endswith("\r\x1b[K")  # erased before the summary
    frames = [f for f in drawn.split("\r\x1b[K") if f]
    assert frames
    assert "/27" in frames[0]
    assert "samples" in frames[0]
    assert "feasible" in frames[0]
    assert "configs" in frames[0]
    assert "feasible:" in run.out


# ---------------------------------------------------------------------------- bad input


def bad_space(text: str) -> Callable[[Path], None]:
    def write(directory: Path) -> None:
        (directory / "space.yaml").write_text(text, encoding="utf-8")

    return write


def bad_ledger(change: Callable[[list[dict[str, Any]]], object]) -> Callable[[Path], None]:
    def write(directory: Path) -> None:
        lines = ledger_lines()
        change(lines)
        write_jsonl(directory / "ledger.jsonl", lines)

    return write


def nothing(directory: Path) -> None:
    """Leave the inputs as they are."""


def _outside(lines: list[dict[str, Any]]) -> None:
    lines.insert(2, {"config": {"model": "huge", "k": 1, "rerank": 1}, "scores": [1.0] * N})


def _violates(lines: list[dict[str, Any]]) -> None:
    lines.append({"config": {"model": "large", "k": 1, "rerank": 4}, "scores": [1.0] * N})


def _short(lines: list[dict[str, Any]]) -> None:
    lines[4]["scores"] = lines[4]["scores"][:20]


def _gappy(lines: list[dict[str, Any]]) -> None:
    lines[1]["samples"] = list(range(1, N + 1))


def _out_of_range(lines: list[dict[str, Any]]) -> None:
    lines[3]["scores"][0] = 1.5


# A broken space.yaml, each with what the error says, under `search_args("--tau", "0.8")`.
BAD_SPACES = {
    "constraint-unknown-parameter": (
        SPACE_YAML.replace("rerank <= k", "reranker <= k"),
        "--space space.yaml: constraint 'reranker <= k': unknown parameter 'reranker'",
    ),
    "empty-values": (
        SPACE_YAML.replace("[1, 2, 4, 8]", "[]"),
        "--space space.yaml: parameters.1.values: List should have at least 1 item",
    ),
    "duplicate-value": (
        SPACE_YAML.replace("[large, medium, small]", "[large, medium, large]"),
        "parameters.0.values: value 'large' is listed twice; list each value once",
    ),
    "malformed-yaml": (
        SPACE_YAML.replace("  - name: k\n", "  - name: k\n   oops: [\n"),
        "--space space.yaml line 6, column 4: not valid YAML or JSON",
    ),
    "space-not-a-mapping": (
        "- just\n- a list\n",
        "--space space.yaml: expected a mapping with parameters and constraints",
    ),
}
# A change that breaks ledger.jsonl, each with what the error says, under the same arguments.
BAD_LEDGERS = {
    "ledger-line-outside-space": (_outside, "--replay ledger.jsonl line 3: configuration"),
    "ledger-line-violates-constraint": (_violates, "--replay ledger.jsonl line 28: configuration"),
    "ledger-line-too-short": (
        _short,
        "--replay ledger.jsonl line 5: 20 scores, but line 1 has 40",
    ),
    "ledger-line-not-contiguous": (
        _gappy,
        "--replay ledger.jsonl line 2: its samples are not 0..39",
    ),
    "ledger-score-out-of-range": (_out_of_range, "--replay: ledger.jsonl line 4:"),
}
# Arguments refused on good inputs, each with what the error says.
BAD_ARGUMENTS = {
    "tau-0": (search_args("--tau", "0"), "--tau: 0 is outside (0, 1]"),
    "tau-1.5": (search_args("--tau", "1.5"), "--tau: 1.5 is outside (0, 1]"),
    "tau-text": (search_args("--tau", "high"), "--tau: 'high' is not a number"),
    "budgets-not-increasing": (
        search_args("--tau", "0.8", "--budgets", "10,25,25"),
        "--budgets: 10,25,25 is not strictly increasing",
    ),
    "budgets-decreasing": (
        search_args("--tau", "0.8", "--budgets", "20,10"),
        "--budgets: 20,10 is not strictly increasing",
    ),
    "seed-negative": (search_args("--tau", "0.8", "--seed", "-1"), "--seed: -1 is below 0"),
    "samples-beyond-memory": (
        live_args("true", "10" + "0" * 11),
        "--samples: 1000000000000 is above 10,000,000",
    ),
    "command-unbalanced-quote": (
        live_args("python 'x", "10"),
        '--command: "python \'x": No closing quotation',
    ),
    "output-is-the-replay": (
        search_args("--tau", "0.8", "--output", "ledger.jsonl"),
        "--output: ledger.jsonl is also --replay",
    ),
    "output-is-the-space": (
        search_args("--tau", "0.8", "--output", "space.yaml"),
        "--output: space.yaml is also --space",
    ),
    "budgets-above-dataset": (
        search_args("--tau", "0.8", "--budgets", "10,20,80"),
        "--budgets: 80 is above the dataset size 40",
    ),
    "confidence": (
        search_args("--tau", "0.8", "--confidence", "1"),
        "--confidence: 1 is outside (0, 1)",
    ),
    "missing-space": (
        ["search", "--space", "nope.yaml", "--replay", "ledger.jsonl", "--tau", "0.8"],
        "--space: nope.yaml: no such file; check the path",
    ),
    "missing-ledger": (
        ["search", "--replay", "nope.jsonl", "--tau", "0.8"],
        "--replay: nope.jsonl: no such file; check the path",
    ),
    "missing-resume": (
        search_args("--tau", "0.8", "--resume", "nope.jsonl"),
        "--resume: nope.jsonl: no such file",
    ),
    "output-dir-missing": (
        search_args("--tau", "0.8", "--output", "no/such/dir/r.json"),
        "--output: directory no/such/dir does not exist",
    ),
    "replay-and-command": (
        search_args("--tau", "0.8", "--command", "true"),
        "--replay/--command/--triton: replay and command given; pass exactly one",
    ),
    "neither-replay-nor-command": (
        ["search", "--space", "space.yaml", "--tau", "0.8"],
        "--replay/--command/--triton: neither given; pass exactly one",
    ),
    "command-without-samples": (
        ["search", "--space", "space.yaml", "--command", "true", "--tau", "0.8"],
        "--samples: required with --command",
    ),
    "empty-command-and-replay": (
        ["search", "--replay", "ledger.jsonl", "--command", "", "--tau", "0.8"],
        "--replay/--command/--triton: replay and command given",
    ),
    "empty-command": (
        ["search", "--space", "space.yaml", "--command", " ", "--samples", "10", "--tau", "1"],
        "--command: empty",
    ),
    "tau-missing": (
        ["search", "--replay", "ledger.jsonl"],
        "the following arguments are required: --tau",
    ),
}


@pytest.mark.parametrize(
    ("setup", "argv", "expected"),
    [
        *(
            pytest.param(bad_space(text), search_args("--tau", "0.8"), expected, id=name)
            for name, (text, expected) in BAD_SPACES.items()
        ),
        *(
            pytest.param(bad_ledger(change), search_args("--tau", "0.8"), expected, id=name)
            for name, (change, expected) in BAD_LEDGERS.items()
        ),
        *(
            pytest.param(nothing, argv, expected, id=name)
            for name, (argv, expected) in BAD_ARGUMENTS.items()
        ),
        pytest.param(
            bad_ledger(_short),
            search_args("--tau", "0.8", "--budgets", "10,20,40"),
            "--replay ledger.jsonl line 5: 20 scores, fewer than the largest budget 40",
            id="ledger-line-shorter-than-budgets",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    inputs: Path,
    cli: Cli,
    setup: Callable[[Path], None],
    argv: list[str],
    expected: str,
) -> None:
    """`compass search: error: <field>: <what>; <fix>`, exit 2, no result and no ledger."""
    setup(inputs)
    before = files(inputs)
    run = cli(argv)
    assert run.code == 2
    assert run.out == ""
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert lines[0].startswith("compass search: error: ")
    assert expected in lines[0]
    assert "; " in lines[0]  # every message ends with the fix
    assert files(inputs) == before


def test_an_existing_ledger_is_never_clobbered(inputs: Path, cli: Cli) -> None:
    """A second run with the same checkpoint path refuses unless --resume is given."""
    argv = search_args("--tau", "0.8", "--output", "r.json")
    assert cli(argv).code == 0
    ledger = inputs / "r.ledger.jsonl"
    content = ledger.read_bytes()
    again = cli(argv)
    assert again.code == 2
    assert again.err.strip() == (
        "compass search: error: --ledger: r.ledger.jsonl exists; pass --resume r.ledger.jsonl "
        "to continue that run, or remove it"
    )
    assert ledger.read_bytes() == content


def test_a_checkpoint_from_another_search_is_refused(inputs: Path, cli: Cli) -> None:
    """Resuming with a checkpoint whose scores contradict the replay ledger is an error."""
    assert cli(search_args("--tau", "0.8", "--ledger", "ck.jsonl")).code == 0
    write_jsonl(inputs / "ledger.jsonl", ledger_lines(seed=1))
    run = cli(search_args("--tau", "0.8", "--resume", "ck.jsonl"))
    assert run.code == 2
    assert run.err.startswith("compass search: error: --resume ck.jsonl: sample ")
    assert "in the replay ledger; this checkpoint belongs to another search" in run.err


def failed_keeping_checkpoint(run: Outcome, result: Path) -> int:
    """Assert run failed at run time (exit 1, no stdout, no result); its checkpoint's fact count."""
    assert run.code == 1
    assert run.out == ""
    assert not result.exists()
    return read_ledger(result.with_suffix(".ledger.jsonl")).fact_count


def test_a_config_missing_from_the_replay_ledger_fails_at_run_time(inputs: Path, cli: Cli) -> None:
    """The space is larger than the ledger: a warning up front, exit 1 when one is needed."""
    write_jsonl(inputs / "ledger.jsonl", ledger_lines()[:20])
    run = cli(search_args("--tau", "0.5", "--method", "grid", "--output", "r.json"))
    assert failed_keeping_checkpoint(run, inputs / "r.json") > 0
    assert "has no scores for 7 of the space's 27 configurations" in run.err
    assert (
        "compass search: error: replay ledger ledger.jsonl has no scores for configuration"
        in run.err
    )
    assert "r.ledger.jsonl keeps the " in run.err
    assert "--resume r.ledger.jsonl" in run.err


# ---------------------------------------------------------------------------- resume


def test_resume_from_a_replay_checkpoint_reuses_everything(inputs: Path, cli: Cli) -> None:
    """A finished run resumed: same result, every sample evaluation reused."""
    assert cli(search_args("--tau", "0.8", "--output", "a.json")).code == 0
    run = cli(search_args("--tau", "0.8", "--output", "b.json", "--resume", "a.ledger.jsonl"))
    assert run.code == 0
    first = read_json(inputs / "a.json")
    assert read_json(inputs / "b.json") == first
    assert reused(first["sample_evals"], "a.ledger.jsonl") in run.err
    assert "evaluated 0 new" in run.err
    assert "(0 new sample evaluations" in run.out


EVALUATOR = """\
import fcntl, json, math, sys, time
log_path, calls_path = sys.argv[1], sys.argv[2]
fail_after, delay = int(sys.argv[3]), float(sys.argv[4])
# Locked: a concurrent search runs several of these at once.
with open(calls_path, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    calls = int(f.read() or 0)
    f.seek(0)
    f.truncate()
    f.write(str(calls + 1))
if fail_after and calls >= fail_after:
    print("simulated crash", file=sys.stderr)
    sys.exit(3)
time.sleep(delay)
request = json.load(sys.stdin)
config = request["config"]
quality = {"large": 0.85, "medium": 0.7, "small": 0.45}[config["model"]]
quality += 0.02 * math.log2(config["k"]) - 0.01 * config["rerank"]
offset = 7 * config["k"] + 3 * config["rerank"] + len(config["model"])
with open(log_path, "a") as log:
    fcntl.flock(log, fcntl.LOCK_EX)
    log.write("".join(json.dumps([config, s], sort_keys=True) + "\\n" for s in request["samples"]))
print(json.dumps([1.0 if (sample * 37 + offset) % 20 < quality * 20 else 0.0
                  for sample in request["samples"]]))
"""
COMMAND_SAMPLES = 20


def evaluator_command(directory: Path, log: str, fail_after: int = 0, delay: float = 0.0) -> str:
    """A --command that scores deterministically, logs every (config, sample) and may crash."""
    script = directory / "evaluate.py"
    script.write_text(EVALUATOR, encoding="utf-8")
    calls = directory / f"{log}.calls"
    calls.unlink(missing_ok=True)
    # -S: no site import, so each evaluation starts fast.
    arguments = (script, directory / log, calls, fail_after, delay)
    return shlex.join([sys.executable, "-S", *map(str, arguments)])


def command_args(command: str, *extra: str) -> list[str]:
    """`compass search` with command as the evaluator on the space of the inputs fixture."""
    settings = ["--samples", str(COMMAND_SAMPLES), "--budgets", "5,10,20", "--tau", "0.8"]
    return ["search", "--space", "space.yaml", "--command", command, *settings, *extra]


def logged(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def clean_result(inputs: Path, cli: Cli) -> Any:
    """An uninterrupted command search: clean.json's result; clean.log logs its evaluations."""
    clean = evaluator_command(inputs, "clean.log")
    assert cli(command_args(clean, "--output", "clean.json")).code == 0
    return read_json(inputs / "clean.json")


def test_command_search_killed_midway_resumes_to_the_same_result(
    inputs: Path, cli: Cli, clean_result: Any
) -> None:
    """An evaluator crash after 6 calls: exit 1, checkpoint kept; resume matches a clean run."""
    crashing = evaluator_command(inputs, "run.log", fail_after=6)
    crashed = cli(command_args(crashing, "--output", "run.json"))
    done = failed_keeping_checkpoint(crashed, inputs / "run.json")
    assert crashed.err.startswith("compass search: error: evaluator command ")
    assert "exit code 3" in crashed.err
    assert "simulated crash" in crashed.err
    assert done == len(logged(inputs / "run.log")) > 0

    resumed = evaluator_command(inputs, "run.log")
    run = cli(command_args(resumed, "--output", "run.json", "--resume", "run.ledger.jsonl"))
    assert run.code == 0, run.err
    assert reused(done, "run.ledger.jsonl") in run.err
    assert read_json(inputs / "run.json") == clean_result
    # Interrupted plus resumed did the clean run's work exactly once.
    run_log = logged(inputs / "run.log")
    assert Counter(run_log).most_common(1)[0][1] == 1
    assert Counter(run_log) == Counter(logged(inputs / "clean.log"))
    assert len(run_log) == clean_result["sample_evals"]


# ---------------------------------------------------------------------------- subprocess

MODULE = [sys.executable, "-m", "compass.commands.main"]


def subprocess_env() -> dict[str, str]:
    """The current environment with the package importable from the source tree."""
    paths = [str(REPO_ROOT / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_module(cwd: Path, argv: list[str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """`python -m compass.commands.main argv` in cwd, as a user runs it; timeout bounds a hang."""
    return subprocess.run(
        [*MODULE, *argv],
        cwd=cwd,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(condition: Callable[[], bool], seconds: float = 60) -> bool:
    """Poll condition until it holds or seconds pass (a bound on a hang only); its last value."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def line_count(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def running(needle: str) -> list[int]:
    """PIDs of live processes whose command line contains needle (none where there is no /proc)."""
    proc = Path("/proc")
    found = []
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # exited meanwhile
        if state != "Z" and needle.encode() in argv:
            found.append(int(entry.name))
    return found


def test_subprocess_search_and_bad_input(inputs: Path) -> None:
    """`python -m compass.commands.main` exits 0 on a search and 2 on bad input, with the same output."""
    done = run_module(inputs, search_args("--tau", "0.8", "--output", "r.json"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "feasible: 9 found" in done.stdout
    assert set(read_json(inputs / "r.json")) == RESULT_KEYS
    bad = run_module(inputs, search_args("--tau", "1.5"))
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.startswith("compass search: error: --tau: 1.5 is outside (0, 1]; ")


def test_subprocess_killed_with_sigkill_resumes_without_reevaluating(
    inputs: Path, clean_result: Any
) -> None:
    """SIGKILL the CLI mid-search, resume: nothing recorded before the kill is evaluated again."""
    slow = evaluator_command(inputs, "killed.log", delay=0.05)
    process = subprocess.Popen(
        [*MODULE, *command_args(slow, "--output", "run.json")],
        cwd=inputs,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ledger = inputs / "run.ledger.jsonl"
    wait_for(lambda: process.poll() is not None or line_count(ledger) >= 4)
    assert process.poll() is None, "the search finished before it could be killed"
    process.kill()
    process.wait(timeout=30)
    # The evaluator child runs in its own session, so the kill spares it: let it finish its batch.
    evaluator = str(inputs / "killed.log")
    assert wait_for(lambda: not running(evaluator)), (
        "the killed search's evaluator never finished its batch"
    )
    recorded = read_ledger(ledger)
    assert recorded.fact_count > 0
    assert not (inputs / "run.json").exists()

    resumed = evaluator_command(inputs, "resumed.log")
    resume = command_args(resumed, "--output", "run.json", "--resume", "run.ledger.jsonl")
    done = run_module(inputs, resume, timeout=300)
    assert done.returncode == 0, done.stderr
    assert reused(recorded.fact_count, "run.ledger.jsonl") in done.stderr
    assert read_json(inputs / "run.json") == clean_result
    for line in logged(inputs / "resumed.log"):
        config, sample = json.loads(line)
        assert sample not in recorded.scores(config), f"re-evaluated {line}"
    assert Counter(logged(inputs / "resumed.log")).most_common(1)[0][1] == 1


# ---------------------------------------------------------------------------- demo


def test_search_only_demo_runs_the_search_alone_and_writes_nothing(tmp_path: Path) -> None:
    """`compass demo --search-only`, as a user runs it: the summary, no files, no live steps."""
    done = run_module(tmp_path, ["demo", "--search-only"])
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert files(tmp_path) == set()
    out = done.stdout
    assert out.startswith("compass demo: the Compass paper's RAG grid (234 configurations")
    assert "tau 0.75, method compass-v" in out
    assert "space: 234 configurations, 100 samples each" in out
    assert "feasible: " in out
    assert "savings: " in out
    assert "result: not written" in out
    # What keeps it to seconds: the replay in memory, and no step of the live demo ("[1/8] ...").
    assert "ledger: none (the demo replays in memory)" in out
    assert not [line for line in out.splitlines() if line.startswith("[")], out
    assert "Triton" not in out


def test_demo_output_finds_the_feasible_configurations(tmp_path: Path, cli: Cli) -> None:
    """--output writes the result; recall against the recorded accuracies is (nearly) total."""
    result_path = tmp_path / "demo.json"
    run = cli(["demo", "--search-only", "--output", str(result_path)])
    assert run.code == 0
    assert f"result: {result_path}" in run.out
    assert files(tmp_path) == {"demo.json"}
    result = read_json(result_path)
    assert set(result) == RESULT_KEYS
    spec, rows = load_rag_paper()
    truth = {config_key(r["config"]) for r in rows if r["accuracy"] >= 0.75}
    found = {config_key(f["config"]) for f in result["feasible"]}
    assert len(found & truth) >= 0.95 * len(truth)
    assert result["sample_evals"] < Space.from_spec(spec).size * 100


def test_demo_replays_the_embedded_ledger_exactly() -> None:
    """The demo's in-memory ledger holds each row's accuracy as its full mean."""
    space, ledger = demo_ledger()
    _, rows = load_rag_paper()
    assert len(ledger) == space.size == len(rows)
    for row in rows[:20]:
        scores = ledger.lookup(row["config"], list(range(100)))
        assert math.isclose(float(np.mean(scores)), row["accuracy"], abs_tol=1e-12)
    rng = np.random.default_rng(0)
    first = replay_scores(rows[0]["accuracy"], 100, rng)
    assert ledger.lookup(rows[0]["config"], list(range(100))).tolist() == first


def test_demo_serves_the_default_beside_the_static_ends_and_the_others_on_runs() -> None:
    """--runs names the runs; by default the static fastest, most accurate and the default
    serving (per-request binding: the experiment's binding run)."""
    assert parse_runs(None) == ("fastest", "accurate", BINDING_RUN)
    assert parse_runs(" elastico,predictive ,elastico") == ("policy", ADMITTED_RUN)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "fastest,eager"], "--runs: unknown run(s) 'eager'; give some of fastest,"),
        (["--runs", ","], "--runs: no run given; give some of fastest, accurate, default"),
        (["--runs", "fastest,accurate"], "--runs: no run serves with a policy"),
        (["--runs", "default", "--search-only"], "--runs: only for the local demo"),
        (["--runs", "default", "--cluster"], "--runs: only for the local demo"),
    ],
)
def test_demo_refuses_runs_it_cannot_serve(cli: Cli, argv: list[str], message: str) -> None:
    """One line naming --runs and the fix, exit 2, before any server starts."""
    run = cli(["demo", *argv])
    assert run.code == 2
    assert message in run.err
    assert "Traceback" not in run.err


def test_a_json_space_reads_exponents_as_numbers(inputs: Path, cli: Cli) -> None:
    """1e-3 is a float in JSON (and in YAML 1.2), not the string PyYAML's YAML 1.1 makes it."""
    space = {"parameters": [{"name": "lr", "type": "float", "values": [1e-3, 2e-3, 5e-1]}]}
    (inputs / "space.json").write_text(json.dumps(space).replace("0.001", "1e-3"))
    (inputs / "space.yaml").write_text(
        "parameters:\n  - {name: lr, type: float, values: [1e-3, 2E-3, .5]}\n"
    )
    lines = [{"config": {"lr": v}, "scores": [1.0] * 10} for v in (1e-3, 2e-3, 0.5)]
    write_jsonl(inputs / "exp.jsonl", lines)
    for name in ("space.json", "space.yaml"):
        run = cli(
            [
                "search",
                "--space",
                name,
                "--replay",
                "exp.jsonl",
                "--tau",
                "0.5",
                "--ledger",
                f"{name}.ledger",
            ]
        )
        assert run.code == 0, run.err
        assert "feasible: 3 found" in run.out


def test_serve_refuses_a_metrics_url_it_would_not_read(cli: Cli) -> None:
    """One line naming --metrics and the fix, exit 2: never a traceback from the data plane."""
    run = cli(
        ["serve", "--policy", "policy.yaml", "--triton", "t:8001", "--metrics", "file:///etc"]
    )
    assert run.code == 2
    assert "--metrics" in run.err
    assert "only http:// or https://" in run.err
    assert "Traceback" not in run.err


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """`compass simulate | head -1`: the pipe closes after one line; the command stops quietly
    with what a shell reports for SIGPIPE (128 + 13)."""
    policy = str(REPO_ROOT / "examples" / "pareto-policy-gitops.yaml")
    process = subprocess.Popen(
        [*MODULE, "simulate", "--policy", policy, "--duration", "60"],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith(b"compass simulate:")
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    assert b"Traceback" not in err, err
    assert process.returncode == 141, err


def test_command_search_at_concurrency_4_gives_the_sequential_result(
    inputs: Path, cli: Cli, clean_result: Any
) -> None:
    """Four command processes at once: the same result, each sample evaluated once."""
    command = evaluator_command(inputs, "concurrent.log")
    run = cli(command_args(command, "--output", "concurrent.json", "--concurrency", "4"))
    assert run.code == 0, run.err
    assert read_json(inputs / "concurrent.json") == clean_result
    assert Counter(logged(inputs / "concurrent.log")) == Counter(logged(inputs / "clean.log"))


def test_replay_with_simulated_service_reports_the_wall_time_it_would_take(
    inputs: Path, cli: Cli
) -> None:
    """--service-ms on a virtual clock: the same result, and the simulated time on stderr."""
    assert cli(search_args("--tau", "0.8", "--output", "plain.json")).code == 0
    one = cli(search_args("--tau", "0.8", "--output", "one.json", "--service-ms", "1000"))
    many = cli(
        search_args(
            "--tau", "0.8", "--output", "many.json", "--service-ms", "1000", "--concurrency", "8"
        )
    )
    assert one.code == many.code == 0, one.err + many.err
    assert read_json(inputs / "one.json") == read_json(inputs / "plain.json")
    assert read_json(inputs / "many.json") == read_json(inputs / "plain.json")

    def seconds(err: str) -> float:
        line = next(x for x in err.splitlines() if "simulated wall time" in x)
        return float(line.split("simulated wall time ")[1].split(" s")[0].replace(",", ""))

    # One server takes the whole service time; eight take several times less.
    assert seconds(one.err) > 3 * seconds(many.err)
    # Eight servers, one configuration a round: the idle ones scored ahead, some for nothing,
    # and the result above is the same; one server never has a spare moment to.
    assert "scored ahead on idle requests were never asked for" in many.err
    assert "scored ahead" not in one.err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--concurrency", "0"], "--concurrency: 0 is below 1"),
        (["--batch", "0"], "--batch: 0 is below 1"),
        (["--service-ms", "-5"], "--service-ms: '-5' is not a positive number"),
    ],
)
def test_bad_concurrency_options_are_named(
    inputs: Path, cli: Cli, extra: list[str], message: str
) -> None:
    run = cli(search_args("--tau", "0.8", *extra))
    assert run.code == 2
    assert message in run.err


def test_the_default_concurrency_needs_the_router_and_says_how_to_do_without(
    inputs: Path, cli: Cli
) -> None:
    # Nothing listens on port 1: auto cannot ask the router how many instances it runs.
    triton = ["--triton", "127.0.0.1:1", "--samples", "10", "--tau", "0.8"]
    run = cli(["search", "--space", "space.yaml", *triton])
    assert run.code == 2
    assert "--concurrency: auto could not read the router's instances" in run.err
    assert "start Triton first, or give K" in run.err


def test_service_ms_is_refused_without_replay(inputs: Path, cli: Cli) -> None:
    run = cli(command_args("true", "--service-ms", "10"))
    assert run.code == 2
    assert "--service-ms: only used with --replay" in run.err
