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
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass.commands.demo import demo_ledger
from compass.commands.main import main
from compass.domain.space import Space, config_key
from compass.evaluators import read_ledger
from compass.examples import build_replay_ledger, load_rag_paper, replay_scores

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULT_KEYS = {"feasible", "evaluated", "sample_evals", "configs_evaluated"}

SPACE_YAML = """\
parameters:
  - name: model
    type: categorical
    values: [large, medium, small]
  - name: k
    type: integer
    values: [1, 2, 4, 8]
  - name: rerank
    type: integer
    values: [1, 2, 4]
constraints:
  - rerank <= k
"""
N = 40
MODEL_ACCURACY = {"large": 0.85, "medium": 0.7, "small": 0.45}


def accuracy(config: dict[str, Any]) -> float:
    """The synthetic ground truth: the model dominates, more retrieval helps a little."""
    quality = MODEL_ACCURACY[config["model"]]
    return float(quality + 0.02 * math.log2(config["k"]) - 0.01 * config["rerank"])


def space_configs() -> list[dict[str, Any]]:
    """Every configuration of SPACE_YAML (27)."""
    return [
        {"model": m, "k": k, "rerank": r}
        for m in MODEL_ACCURACY
        for k in (1, 2, 4, 8)
        for r in (1, 2, 4)
        if r <= k
    ]


def ledger_lines(n: int = N, seed: int = 0) -> list[dict[str, Any]]:
    """A replay ledger of the synthetic space, n samples a configuration."""
    rows = [{"config": c, "accuracy": accuracy(c)} for c in space_configs()]
    return build_replay_ledger(rows, n, seed)


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory (the cwd) holding space.yaml and ledger.jsonl for the synthetic space."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE_YAML, encoding="utf-8")
    write_jsonl(tmp_path / "ledger.jsonl", ledger_lines())
    return tmp_path


def files(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """--help prints usage and succeeds."""
    assert main(["search", "--help"]) == 0
    assert "--replay" in capsys.readouterr().out


# ---------------------------------------------------------------------------- replay


def test_replay_search_writes_result_and_ledger(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay search writes exactly the result keys, a checkpoint ledger and a summary."""
    code = main(
        [
            "search",
            "--space",
            "space.yaml",
            "--replay",
            "ledger.jsonl",
            "--tau",
            "0.8",
            "--output",
            "result.json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""  # not a terminal: no progress line, and nothing else to say
    result = json.loads((inputs / "result.json").read_text())
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
        "tau 0.8, method compass-v, interval wilson",
        "space: 27 configurations, 40 samples each",
        f"feasible: {len(truth)} found",
        f"evaluated: {len(evaluated)} of 27 configurations, {result['sample_evals']:,} sample",
        "savings: ",
        "(1,080 = 27 configurations x 40 samples)",
        "stopped: ",
        "result: result.json",
        "ledger: result.ledger.jsonl",
    ):
        assert expected in out
    assert len(out.splitlines()) <= 24  # one screen


def test_grid_method_evaluates_every_configuration(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--method grid --interval betting: all 27 configurations, in space order."""
    code = main(
        [
            "search",
            "--space",
            "space.yaml",
            "--replay",
            "ledger.jsonl",
            "--tau",
            "0.8",
            "--method",
            "grid",
            "--interval",
            "betting",
            "--budgets",
            "10,20,40",
            "--output",
            "grid.json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads((inputs / "grid.json").read_text())
    assert result["configs_evaluated"] == 27
    assert "method grid, interval betting" in out
    assert "budgets 10,20,40" in out


def test_without_output_the_ledger_goes_to_the_cwd(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --output: the checkpoint is ./compass-search.ledger.jsonl and no result is written."""
    code = main(["search", "--space", "space.yaml", "--replay", "ledger.jsonl", "--tau", "0.7"])
    out = capsys.readouterr().out
    assert code == 0
    assert files(inputs) == {"space.yaml", "ledger.jsonl", "compass-search.ledger.jsonl"}
    assert "result: not written" in out


def test_explicit_ledger_path(inputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--ledger puts the checkpoint where asked."""
    code = main(
        [
            "search",
            "--space",
            "space.yaml",
            "--replay",
            "ledger.jsonl",
            "--tau",
            "0.7",
            "--ledger",
            "ck.jsonl",
        ]
    )
    assert code == 0
    assert (inputs / "ck.jsonl").stat().st_size > 0
    assert "ledger: ck.jsonl" in capsys.readouterr().out


def test_space_is_inferred_from_the_ledger_and_said_so(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --space: the ledger's configurations span the space; stderr lists the parameters."""
    code = main(["search", "--replay", "ledger.jsonl", "--tau", "0.8", "--output", "r.json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "no --space given: inferred the space from the 27 configurations" in err
    assert "model (categorical): large, medium, small" in err
    assert "k (integer): 1, 2, 4, 8" in err
    assert "rerank (integer): 1, 2, 4" in err
    assert "space: 27 configurations" in out


def test_a_compound_workflow_manifest_is_accepted_as_space(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CompoundWorkflow document: its spec.space is the space."""
    indented = "".join(f"    {line}\n" for line in SPACE_YAML.splitlines())
    (inputs / "workflow.yaml").write_text(
        f"kind: CompoundWorkflow\nspec:\n  space:\n{indented}", encoding="utf-8"
    )
    code = main(["search", "--space", "workflow.yaml", "--replay", "ledger.jsonl", "--tau", "0.8"])
    assert code == 0, capsys.readouterr().err


def test_progress_line_only_on_a_terminal(
    inputs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a TTY, one line redrawn in place with phase, configs/space, samples and feasible."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["search", "--space", "space.yaml", "--replay", "ledger.jsonl", "--tau", "0.8"])
    assert code == 0
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
    assert "feasible:" in capsys.readouterr().out


# ---------------------------------------------------------------------------- bad input


def search_args(*extra: str) -> list[str]:
    return ["search", "--space", "space.yaml", "--replay", "ledger.jsonl", *extra]


def bad_space(text: str) -> Any:
    def write(directory: Path) -> None:
        (directory / "space.yaml").write_text(text, encoding="utf-8")

    return write


def bad_ledger(change: Any) -> Any:
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


CONSTRAINT_UNKNOWN = SPACE_YAML.replace("rerank <= k", "reranker <= k")
EMPTY_VALUES = SPACE_YAML.replace("[1, 2, 4, 8]", "[]")
DUPLICATE_VALUE = SPACE_YAML.replace("[large, medium, small]", "[large, medium, large]")
MALFORMED = SPACE_YAML.replace("  - name: k\n", "  - name: k\n   oops: [\n")


@pytest.mark.parametrize(
    ("setup", "argv", "expected"),
    [
        pytest.param(
            bad_space(CONSTRAINT_UNKNOWN),
            search_args("--tau", "0.8"),
            "--space space.yaml: constraint 'reranker <= k': unknown parameter 'reranker'",
            id="constraint-unknown-parameter",
        ),
        pytest.param(
            bad_space(EMPTY_VALUES),
            search_args("--tau", "0.8"),
            "--space space.yaml: parameters.1.values: List should have at least 1 item",
            id="empty-values",
        ),
        pytest.param(
            bad_space(DUPLICATE_VALUE),
            search_args("--tau", "0.8"),
            "parameters.0.values: value 'large' is listed twice; list each value once",
            id="duplicate-value",
        ),
        pytest.param(
            bad_space(MALFORMED),
            search_args("--tau", "0.8"),
            "--space space.yaml line 6, column 4: not valid YAML or JSON",
            id="malformed-yaml",
        ),
        pytest.param(
            bad_space("- just\n- a list\n"),
            search_args("--tau", "0.8"),
            "--space space.yaml: expected a mapping with parameters and constraints",
            id="space-not-a-mapping",
        ),
        pytest.param(
            bad_ledger(_outside),
            search_args("--tau", "0.8"),
            "--replay ledger.jsonl line 3: configuration",
            id="ledger-line-outside-space",
        ),
        pytest.param(
            bad_ledger(_violates),
            search_args("--tau", "0.8"),
            "--replay ledger.jsonl line 28: configuration",
            id="ledger-line-violates-constraint",
        ),
        pytest.param(
            bad_ledger(_short),
            search_args("--tau", "0.8"),
            "--replay ledger.jsonl line 5: 20 scores, fewer than the largest budget 40",
            id="ledger-line-too-short",
        ),
        pytest.param(
            bad_ledger(_gappy),
            search_args("--tau", "0.8"),
            "--replay ledger.jsonl line 2: its samples are not 0..39",
            id="ledger-line-not-contiguous",
        ),
        pytest.param(
            bad_ledger(lambda lines: lines[3]["scores"].__setitem__(0, 1.5)),
            search_args("--tau", "0.8"),
            "--replay: ledger.jsonl line 4:",
            id="ledger-score-out-of-range",
        ),
        pytest.param(nothing, search_args("--tau", "0"), "--tau: 0 is outside (0, 1]", id="tau-0"),
        pytest.param(
            nothing, search_args("--tau", "1.5"), "--tau: 1.5 is outside (0, 1]", id="tau-1.5"
        ),
        pytest.param(
            nothing, search_args("--tau", "high"), "--tau: 'high' is not a number", id="tau-text"
        ),
        pytest.param(
            nothing,
            search_args("--tau", "0.8", "--budgets", "10,25,25"),
            "--budgets: 10,25,25 is not strictly increasing",
            id="budgets-not-increasing",
        ),
        pytest.param(
            nothing,
            search_args("--tau", "0.8", "--budgets", "20,10"),
            "--budgets: 20,10 is not strictly increasing",
            id="budgets-decreasing",
        ),
        pytest.param(
            nothing,
            search_args("--tau", "0.8", "--budgets", "10,20,80"),
            "--budgets: 80 is above the dataset size 40",
            id="budgets-above-dataset",
        ),
        pytest.param(
            nothing,
            search_args("--tau", "0.8", "--confidence", "1"),
            "--confidence: 1 is outside (0, 1)",
            id="confidence",
        ),
        pytest.param(
            nothing,
            ["search", "--space", "nope.yaml", "--replay", "ledger.jsonl", "--tau", "0.8"],
            "--space: nope.yaml: no such file; check the path",
            id="missing-space",
        ),
        pytest.param(
            nothing,
            ["search", "--replay", "nope.jsonl", "--tau", "0.8"],
            "--replay: nope.jsonl: no such file; check the path",
            id="missing-ledger",
        ),
        pytest.param(
            nothing,
            search_args("--tau", "0.8", "--resume", "nope.jsonl"),
            "--resume: nope.jsonl: no such file",
            id="missing-resume",
        ),
        pytest.param(
            nothing,
            search_args("--tau", "0.8", "--output", "no/such/dir/r.json"),
            "--output: directory no/such/dir does not exist",
            id="output-dir-missing",
        ),
        pytest.param(
            nothing,
            search_args("--tau", "0.8", "--command", "true"),
            "--replay/--command/--triton: replay and command given; pass exactly one",
            id="replay-and-command",
        ),
        pytest.param(
            nothing,
            ["search", "--space", "space.yaml", "--tau", "0.8"],
            "--replay/--command/--triton: neither given; pass exactly one",
            id="neither-replay-nor-command",
        ),
        pytest.param(
            nothing,
            ["search", "--space", "space.yaml", "--command", "true", "--tau", "0.8"],
            "--samples: required with --command",
            id="command-without-samples",
        ),
        pytest.param(
            nothing,
            ["search", "--replay", "ledger.jsonl", "--command", "", "--tau", "0.8"],
            "--replay/--command/--triton: replay and command given",
            id="empty-command-and-replay",
        ),
        pytest.param(
            nothing,
            ["search", "--space", "space.yaml", "--command", " ", "--samples", "10", "--tau", "1"],
            "--command: empty",
            id="empty-command",
        ),
        pytest.param(
            nothing,
            ["search", "--replay", "ledger.jsonl"],
            "the following arguments are required: --tau",
            id="tau-missing",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    inputs: Path,
    capsys: pytest.CaptureFixture[str],
    setup: Any,
    argv: list[str],
    expected: str,
) -> None:
    """`compass search: error: <field>: <what>; <fix>`, exit 2, no result and no ledger."""
    setup(inputs)
    before = files(inputs)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("compass search: error: ")
    assert expected in lines[0]
    assert "; " in lines[0]  # every message ends with the fix
    assert files(inputs) == before


def test_an_existing_ledger_is_never_clobbered(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second run with the same checkpoint path refuses unless --resume is given."""
    argv = search_args("--tau", "0.8", "--output", "r.json")
    assert main(argv) == 0
    capsys.readouterr()
    ledger = inputs / "r.ledger.jsonl"
    content = ledger.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "compass search: error: --ledger: r.ledger.jsonl exists; pass --resume r.ledger.jsonl "
        "to continue that run, or remove it"
    )
    assert ledger.read_bytes() == content


def test_a_checkpoint_from_another_search_is_refused(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resuming with a checkpoint whose scores contradict the replay ledger is an error."""
    assert main(search_args("--tau", "0.8", "--ledger", "ck.jsonl")) == 0
    write_jsonl(inputs / "ledger.jsonl", ledger_lines(seed=1))
    capsys.readouterr()
    assert main(search_args("--tau", "0.8", "--resume", "ck.jsonl")) == 2
    err = capsys.readouterr().err
    assert err.startswith("compass search: error: --resume ck.jsonl: sample ")
    assert "in the replay ledger; this checkpoint belongs to another search" in err


def test_a_config_missing_from_the_replay_ledger_fails_at_run_time(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The space is larger than the ledger: a warning up front, exit 1 when one is needed."""
    write_jsonl(inputs / "ledger.jsonl", ledger_lines()[:20])
    code = main(search_args("--tau", "0.5", "--method", "grid", "--output", "r.json"))
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert "has no scores for 7 of the space's 27 configurations" in err
    assert (
        "compass search: error: replay ledger ledger.jsonl has no scores for configuration" in err
    )
    assert "r.ledger.jsonl keeps the " in err
    assert "--resume r.ledger.jsonl" in err
    assert not (inputs / "r.json").exists()
    assert read_ledger(inputs / "r.ledger.jsonl").fact_count > 0


# ---------------------------------------------------------------------------- resume


def test_resume_from_a_replay_checkpoint_reuses_everything(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished run resumed: same result, every sample evaluation reused."""
    assert main(search_args("--tau", "0.8", "--output", "a.json")) == 0
    capsys.readouterr()
    code = main(search_args("--tau", "0.8", "--output", "b.json", "--resume", "a.ledger.jsonl"))
    out, err = capsys.readouterr()
    assert code == 0
    first = json.loads((inputs / "a.json").read_text())
    assert json.loads((inputs / "b.json").read_text()) == first
    assert f"reused {first['sample_evals']:,} sample evaluations from a.ledger.jsonl" in err
    assert "evaluated 0 new" in err
    assert "(0 new sample evaluations" in out


EVALUATOR = """\
import json, math, sys, time
log_path, calls_path = sys.argv[1], sys.argv[2]
fail_after, delay = int(sys.argv[3]), float(sys.argv[4])
try:
    with open(calls_path) as f:
        calls = int(f.read())
except FileNotFoundError:
    calls = 0
with open(calls_path, "w") as f:
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
    for sample in request["samples"]:
        log.write(json.dumps([config, sample], sort_keys=True) + "\\n")
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
    return shlex.join(
        [
            sys.executable,
            "-S",
            str(script),
            str(directory / log),
            str(calls),
            str(fail_after),
            str(delay),
        ]
    )


def command_args(command: str, *extra: str) -> list[str]:
    return [
        "search",
        "--space",
        "space.yaml",
        "--command",
        command,
        "--samples",
        str(COMMAND_SAMPLES),
        "--budgets",
        "5,10,20",
        "--tau",
        "0.8",
        *extra,
    ]


def logged(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_command_search_killed_midway_resumes_to_the_same_result(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An evaluator crash after 6 calls: exit 1, checkpoint kept; resume matches a clean run."""
    clean = evaluator_command(inputs, "clean.log")
    assert main(command_args(clean, "--output", "clean.json")) == 0
    capsys.readouterr()

    crashing = evaluator_command(inputs, "run.log", fail_after=6)
    assert main(command_args(crashing, "--output", "run.json")) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("compass search: error: evaluator command ")
    assert "exit code 3" in err
    assert "simulated crash" in err
    assert not (inputs / "run.json").exists()
    done = read_ledger(inputs / "run.ledger.jsonl").fact_count
    assert done == len(logged(inputs / "run.log")) > 0

    resumed = evaluator_command(inputs, "run.log")
    code = main(command_args(resumed, "--output", "run.json", "--resume", "run.ledger.jsonl"))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"reused {done:,} sample evaluations from run.ledger.jsonl" in err
    clean_result = json.loads((inputs / "clean.json").read_text())
    assert json.loads((inputs / "run.json").read_text()) == clean_result
    # Interrupted plus resumed did the clean run's work exactly once.
    run_log = logged(inputs / "run.log")
    assert Counter(run_log).most_common(1)[0][1] == 1
    assert Counter(run_log) == Counter(logged(inputs / "clean.log"))
    assert len(run_log) == clean_result["sample_evals"]


# ---------------------------------------------------------------------------- subprocess


def subprocess_env() -> dict[str, str]:
    """The current environment with the package importable from the source tree."""
    paths = [str(REPO_ROOT / "operator"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_subprocess_search_and_bad_input(inputs: Path) -> None:
    """`python -m compass.commands.main` exits 0 on a search and 2 on bad input, with the same output."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compass.commands.main",
            *search_args("--tau", "0.8", "--output", "r.json"),
        ],
        cwd=inputs,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "feasible: 9 found" in done.stdout
    assert set(json.loads((inputs / "r.json").read_text())) == RESULT_KEYS
    bad = subprocess.run(
        [sys.executable, "-m", "compass.commands.main", *search_args("--tau", "1.5")],
        cwd=inputs,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.startswith("compass search: error: --tau: 1.5 is outside (0, 1]; ")


def test_subprocess_killed_with_sigkill_resumes_without_reevaluating(inputs: Path) -> None:
    """SIGKILL the CLI mid-search, resume: nothing recorded before the kill is evaluated again."""
    clean = evaluator_command(inputs, "clean.log")
    assert main(command_args(clean, "--output", "clean.json")) == 0

    slow = evaluator_command(inputs, "killed.log", delay=0.05)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "compass.commands.main",
            *command_args(slow, "--output", "run.json"),
        ],
        cwd=inputs,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ledger = inputs / "run.ledger.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if ledger.exists() and len(ledger.read_bytes().splitlines()) >= 4:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the search finished before it could be killed"
    process.kill()
    process.wait(timeout=30)
    # The evaluator child runs in its own session, so the kill spares it: let it finish its batch.
    evaluator = str(inputs / "killed.log")
    deadline = time.monotonic() + 60  # bounds a hang only
    while running(evaluator) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running(evaluator), "the killed search's evaluator never finished its batch"
    recorded = read_ledger(ledger)
    assert recorded.fact_count > 0
    assert not (inputs / "run.json").exists()

    resumed = evaluator_command(inputs, "resumed.log")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compass.commands.main",
            *command_args(resumed, "--output", "run.json", "--resume", "run.ledger.jsonl"),
        ],
        cwd=inputs,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"reused {recorded.fact_count:,} sample evaluations" in done.stderr
    assert json.loads((inputs / "run.json").read_text()) == json.loads(
        (inputs / "clean.json").read_text()
    )
    for line in logged(inputs / "resumed.log"):
        config, sample = json.loads(line)
        assert not recorded.known(config, [sample])[0], f"re-evaluated {line}"
    assert Counter(logged(inputs / "resumed.log")).most_common(1)[0][1] == 1


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


# ---------------------------------------------------------------------------- demo


def test_search_only_demo_runs_the_search_alone_and_writes_nothing(tmp_path: Path) -> None:
    """`compass demo --search-only`, as a user runs it: the summary, no files, no live steps."""
    done = subprocess.run(
        [sys.executable, "-m", "compass.commands.main", "demo", "--search-only"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,  # bounds a hang only
        check=False,
    )
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


def test_demo_output_finds_the_feasible_configurations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--output writes the result; recall against the recorded accuracies is (nearly) total."""
    result_path = tmp_path / "demo.json"
    assert main(["demo", "--search-only", "--output", str(result_path)]) == 0
    assert f"result: {result_path}" in capsys.readouterr().out
    assert files(tmp_path) == {"demo.json"}
    result = json.loads(result_path.read_text())
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
