"""A corpus of bad input for every `compass` subcommand (issue 15 part 9, the CLI half).

Each case must exit 2 with exactly one stderr line naming the flag or field, no traceback, and
leave every input file as it was. `python tests/unit/test_cli_corpus.py` prints the counts.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli import SPACE_YAML, ledger_lines, write_jsonl
from test_plan_cli import PROFILES

from compass.commands.main import main

HUGE = "9" * 400
SPACE = ["--space", "space.yaml"]
LIVE = [*SPACE, "--command", "true", "--samples", "10"]
REPLAY = ["--replay", "replay.jsonl"]
POLICY = ["--policy", "policy.yaml"]
TRITON = ["--triton", "localhost:1"]
METRICS = ["--metrics", "http://localhost:2/metrics"]


@dataclass(frozen=True)
class Case:
    """One bad invocation: argv, what the error line must name, and how to spoil an input."""

    name: str
    argv: list[str]
    needle: str
    spoil: Callable[[Path], None] | None = None
    extra: dict[str, str] = field(default_factory=dict)


def write(name: str, text: str) -> Callable[[Path], None]:
    """A spoiler that writes text into the named file."""

    def spoil(directory: Path) -> None:
        (directory / name).write_text(text, encoding="utf-8")

    return spoil


def replace(name: str, old: str, new: str) -> Callable[[Path], None]:
    """A spoiler that replaces old (which must be there) by new in the named file."""

    def spoil(directory: Path) -> None:
        text = (directory / name).read_text(encoding="utf-8")
        assert old in text, (name, old)
        (directory / name).write_text(text.replace(old, new, 1), encoding="utf-8")

    return spoil


def truncate(name: str, cut: int) -> Callable[[Path], None]:
    def spoil(directory: Path) -> None:
        data = (directory / name).read_bytes()
        (directory / name).write_bytes(data[:-cut])

    return spoil


def symlink(name: str, target: str) -> Callable[[Path], None]:
    def spoil(directory: Path) -> None:
        (directory / name).symlink_to(target)

    return spoil


def search(*argv: str) -> list[str]:
    return ["search", *argv]


CASES = [
    # ---------------------------------------------------------------- search: flags
    Case("search-tau-missing", search(*REPLAY), "--tau"),
    Case("search-tau-text", search(*REPLAY, "--tau", "high"), "--tau"),
    Case("search-tau-zero", search(*REPLAY, "--tau", "0"), "--tau"),
    Case("search-tau-nan", search(*REPLAY, "--tau", "nan"), "--tau"),
    Case("search-tau-inf", search(*REPLAY, "--tau", "inf"), "--tau"),
    Case("search-tau-huge", search(*REPLAY, "--tau", HUGE), "--tau"),
    Case(
        "search-confidence-one", search(*REPLAY, "--tau", ".5", "--confidence", "1"), "--confidence"
    ),
    Case(
        "search-confidence-text",
        search(*REPLAY, "--tau", ".5", "--confidence", "x"),
        "--confidence",
    ),
    Case("search-seed-negative", search(*REPLAY, "--tau", ".5", "--seed", "-1"), "--seed"),
    Case("search-seed-huge", search(*REPLAY, "--tau", ".5", "--seed", HUGE), "--seed"),
    Case("search-seed-float", search(*REPLAY, "--tau", ".5", "--seed", "1.5"), "--seed"),
    Case("search-budgets-text", search(*REPLAY, "--tau", ".5", "--budgets", "a,b"), "--budgets"),
    Case("search-budgets-order", search(*REPLAY, "--tau", ".5", "--budgets", "20,10"), "--budgets"),
    Case("search-budgets-zero", search(*REPLAY, "--tau", ".5", "--budgets", "0,10"), "--budgets"),
    Case(
        "search-budgets-huge", search(*REPLAY, "--tau", ".5", "--budgets", f"1,{HUGE}"), "--budgets"
    ),
    Case(
        "search-budgets-beyond", search(*REPLAY, "--tau", ".5", "--budgets", "10,80"), "--budgets"
    ),
    Case("search-method", search(*REPLAY, "--tau", ".5", "--method", "magic"), "--method"),
    Case("search-interval", search(*REPLAY, "--tau", ".5", "--interval", "x"), "--interval"),
    Case("search-no-source", search(*SPACE, "--tau", ".5"), "--replay/--command/--triton"),
    Case(
        "search-two-sources", search(*REPLAY, *LIVE, "--tau", ".5"), "--replay/--command/--triton"
    ),
    Case("search-samples-missing", search(*SPACE, "--command", "true", "--tau", ".5"), "--samples"),
    Case(
        "search-samples-text",
        search(*SPACE, "--command", "true", "--samples", "x", "--tau", ".5"),
        "--samples",
    ),
    Case(
        "search-samples-zero",
        search(*SPACE, "--command", "true", "--samples", "0", "--tau", ".5"),
        "--samples",
    ),
    Case(
        "search-samples-1e12",
        search(*SPACE, "--command", "true", "--samples", "1000000000000", "--tau", ".5"),
        "--samples",
    ),
    Case(
        "search-samples-huge",
        search(*SPACE, "--command", "true", "--samples", HUGE, "--tau", ".5"),
        "--samples",
    ),
    Case(
        "search-samples-with-replay", search(*REPLAY, "--samples", "10", "--tau", ".5"), "--samples"
    ),
    Case(
        "search-command-quote",
        search(*SPACE, "--command", "python 'x", "--samples", "9", "--tau", ".5"),
        "--command",
    ),
    Case(
        "search-command-empty",
        search(*SPACE, "--command", " ", "--samples", "9", "--tau", ".5"),
        "--command",
    ),
    Case(
        "search-command-no-space",
        search("--command", "true", "--samples", "9", "--tau", ".5"),
        "--space",
    ),
    Case(
        "search-output-replay",
        search(*REPLAY, "--tau", ".5", "--output", "replay.jsonl"),
        "--output",
    ),
    Case(
        "search-output-space",
        search(*REPLAY, *SPACE, "--tau", ".5", "--output", "space.yaml"),
        "--output",
    ),
    Case(
        "search-output-symlink",
        search(*REPLAY, "--tau", ".5", "--output", "r.jsonl"),
        "--output",
        symlink("r.jsonl", "replay.jsonl"),
    ),
    Case(
        "search-output-dir", search(*REPLAY, "--tau", ".5", "--output", "no/dir/r.json"), "--output"
    ),
    Case(
        "search-ledger-replay",
        search(*REPLAY, "--tau", ".5", "--ledger", "replay.jsonl"),
        "--ledger",
    ),
    Case(
        "search-ledger-exists", search(*REPLAY, "--tau", ".5", "--ledger", "space.yaml"), "--ledger"
    ),
    Case(
        "search-resume-missing",
        search(*REPLAY, "--tau", ".5", "--resume", "nope.jsonl"),
        "--resume",
    ),
    Case(
        "search-resume-space", search(*REPLAY, "--tau", ".5", "--resume", "space.yaml"), "--resume"
    ),
    # ---------------------------------------------------------------- search: files
    Case("space-missing", search("--space", "nope.yaml", *REPLAY, "--tau", ".5"), "--space"),
    Case(
        "space-yaml-syntax",
        search(*SPACE, *REPLAY, "--tau", ".5"),
        "--space",
        write("space.yaml", "parameters: [\n"),
    ),
    Case(
        "space-not-mapping",
        search(*SPACE, *REPLAY, "--tau", ".5"),
        "--space",
        write("space.yaml", "- a\n- b\n"),
    ),
    Case(
        "space-nan",
        search(*LIVE, "--tau", ".5"),
        "--space",
        replace("space.yaml", "[1, 2, 4, 8]", "[1, 2, .nan]"),
    ),
    Case(
        "space-inf",
        search(*LIVE, "--tau", ".5"),
        "--space",
        replace("space.yaml", "[1, 2, 4, 8]", "[1, 2, .inf]"),
    ),
    Case(
        "space-huge-int",
        search(*LIVE, "--tau", ".5"),
        "--space",
        replace("space.yaml", "[1, 2, 4, 8]", f"[1, {HUGE}]"),
    ),
    Case(
        "space-bad-name",
        search(*LIVE, "--tau", ".5"),
        "--space",
        replace("space.yaml", "name: k", "name: k\u00e9"),
    ),
    Case(
        "space-unknown-constraint",
        search(*LIVE, "--tau", ".5"),
        "--space",
        replace("space.yaml", "rerank <= k", "x <= k"),
    ),
    Case(
        "space-duplicate-value",
        search(*LIVE, "--tau", ".5"),
        "--space",
        replace("space.yaml", "[1, 2, 4, 8]", "[1, 1]"),
    ),
    Case(
        "space-json-invalid",
        search("--space", "s.json", "--command", "true", "--samples", "9", "--tau", ".5"),
        "--space",
        write("s.json", '{"parameters": [],}'),
    ),
    Case(
        "space-binary",
        search(*LIVE, "--tau", ".5"),
        "--space",
        lambda d: (d / "space.yaml").write_bytes(b"\xff\xfe\x00"),
    ),
    Case("replay-missing", search("--replay", "nope.jsonl", "--tau", ".5"), "--replay"),
    Case("replay-empty", search(*REPLAY, "--tau", ".5"), "--replay", write("replay.jsonl", "")),
    Case(
        "replay-truncated", search(*REPLAY, "--tau", ".5"), "--replay", truncate("replay.jsonl", 30)
    ),
    Case(
        "replay-not-json",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", "nope\n{}\n"),
    ),
    Case(
        "replay-non-ascii-name",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", '{"config": {"\u00e9": 1}, "scores": [1]}\n'),
    ),
    Case(
        "replay-empty-config",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", '{"config": {}, "scores": [1]}\n'),
    ),
    Case(
        "replay-huge-config",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", f'{{"config": {{"k": {HUGE}}}, "scores": [1]}}\n'),
    ),
    Case(
        "replay-huge-sample",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", f'{{"config": {{"k": 1}}, "samples": [{HUGE}], "scores": [1]}}\n'),
    ),
    Case(
        "replay-1e12-sample",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", '{"config": {"k": 1}, "samples": [1000000000000], "scores": [1]}\n'),
    ),
    Case(
        "replay-nan-config",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", '{"config": {"k": NaN}, "scores": [1]}\n'),
    ),
    Case(
        "replay-score-2",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", '{"config": {"k": 1}, "scores": [2]}\n'),
    ),
    Case(
        "replay-outside-space",
        search(*REPLAY, *SPACE, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", '{"config": {"k": 3}, "scores": [1]}\n'),
    ),
    # ---------------------------------------------------------------- plan
    Case("plan-slo-missing", ["plan", "--profiles", "profiles.json"], "--slo-ms"),
    Case("plan-slo-text", ["plan", "--profiles", "profiles.json", "--slo-ms", "fast"], "--slo-ms"),
    Case(
        "plan-slo-negative", ["plan", "--profiles", "profiles.json", "--slo-ms", "-3"], "--slo-ms"
    ),
    Case("plan-slo-nan", ["plan", "--profiles", "profiles.json", "--slo-ms", "nan"], "--slo-ms"),
    Case("plan-slo-inf", ["plan", "--profiles", "profiles.json", "--slo-ms", "inf"], "--slo-ms"),
    Case(
        "plan-slo-1e308", ["plan", "--profiles", "profiles.json", "--slo-ms", "1e308"], "--slo-ms"
    ),
    Case("plan-slo-too-low", ["plan", "--profiles", "profiles.json", "--slo-ms", "10"], "--slo-ms"),
    Case(
        "plan-percentile-100",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--percentile", "100"],
        "--percentile",
    ),
    Case(
        "plan-slack-negative",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--slack-ms", "-1"],
        "--slack-ms",
    ),
    Case(
        "plan-instances-huge",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--router-instances", HUGE],
        "--router-instances",
    ),
    Case(
        "plan-model",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--model", "x"],
        "--model",
    ),
    Case(
        "plan-output-profiles",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--output", "profiles.json"],
        "--output",
    ),
    Case(
        "plan-plot-profiles",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--plot", "profiles.json"],
        "--plot",
    ),
    Case(
        "plan-profiles-missing",
        ["plan", "--profiles", "nope.json", "--slo-ms", "800"],
        "--profiles",
    ),
    Case(
        "plan-profiles-invalid",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800"],
        "--profiles",
        write("profiles.json", "{nope"),
    ),
    Case(
        "plan-profiles-nan",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800"],
        "--profiles",
        replace("profiles.json", '"latency_std_ms": 15', '"latency_std_ms": NaN'),
    ),
    Case(
        "plan-profiles-huge",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800"],
        "--profiles",
        replace("profiles.json", '"latency_std_ms": 15', f'"latency_std_ms": {HUGE}'),
    ),
    Case(
        "plan-profiles-empty",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800"],
        "--profiles",
        write("profiles.json", "[]"),
    ),
    # ---------------------------------------------------------------- simulate
    Case("simulate-policy-missing", ["simulate", "--policy", "nope.yaml"], "--policy"),
    Case("simulate-seed-negative", ["simulate", *POLICY, "--seed", "-1"], "--seed"),
    Case("simulate-seed-huge", ["simulate", *POLICY, "--seed", HUGE], "--seed"),
    Case("simulate-duration-zero", ["simulate", *POLICY, "--duration", "0"], "--duration"),
    Case(
        "simulate-duration-huge",
        ["simulate", *POLICY, "--duration", "1e7", "--base-qps", "1e4"],
        "--duration",
    ),
    Case("simulate-base-qps-nan", ["simulate", *POLICY, "--base-qps", "nan"], "--base-qps"),
    Case("simulate-pods-huge", ["simulate", *POLICY, "--pods", "1e300"], "--pods"),
    Case("simulate-pods-fraction", ["simulate", *POLICY, "--pods", "1.5"], "--pods"),
    Case(
        "simulate-switch-delay",
        ["simulate", *POLICY, "--switch-delay-ms", "-1"],
        "--switch-delay-ms",
    ),
    Case(
        "simulate-quantile",
        ["simulate", *POLICY, "--admission", "--admission-quantile", "1"],
        "--admission-quantile",
    ),
    Case(
        "simulate-degrade-after",
        ["simulate", *POLICY, "--admission", "--degrade-after", "2"],
        "--degrade-after",
    ),
    Case("simulate-trace-without-file", ["simulate", *POLICY, "--pattern", "trace"], "--trace"),
    Case(
        "simulate-trace-text",
        ["simulate", *POLICY, "--pattern", "trace", "--trace", "trace.txt"],
        "--trace",
        write("trace.txt", "0.1\nsoon\n"),
    ),
    Case(
        "simulate-timeline-policy", ["simulate", *POLICY, "--timeline", "policy.yaml"], "--timeline"
    ),
    Case(
        "simulate-timeline-symlink",
        ["simulate", "--policy", "p.yaml", "--timeline", "policy.yaml"],
        "--timeline",
        symlink("p.yaml", "policy.yaml"),
    ),
    Case("simulate-plot-policy", ["simulate", *POLICY, "--plot", "policy.yaml"], "--plot"),
    Case(
        "simulate-policy-field",
        ["simulate", *POLICY],
        "surprise",
        replace("policy.yaml", "\n  slo:", "\n  surprise: 1\n  slo:"),
    ),
    Case(
        "simulate-policy-nan",
        ["simulate", *POLICY],
        "--policy",
        replace("policy.yaml", "latencyMs: 800", "latencyMs: .nan"),
    ),
    # ---------------------------------------------------------------- profile, load, serve
    Case(
        "profile-result-missing",
        ["profile", *TRITON, "--result", "nope.json", "--output", "p.json"],
        "--result",
    ),
    Case(
        "profile-output-result",
        ["profile", *TRITON, "--result", "result.json", "--output", "result.json"],
        "--output",
    ),
    Case(
        "profile-warmup",
        ["profile", *TRITON, "--result", "result.json", "--output", "p.json", "--warmup", "x"],
        "--warmup",
    ),
    Case(
        "profile-runs-huge",
        ["profile", *TRITON, "--result", "result.json", "--output", "p.json", "--runs", HUGE],
        "--runs",
    ),
    Case("load-samples", ["load", *TRITON, "--samples", "0"], "--samples"),
    Case("load-seed", ["load", *TRITON, "--seed", "-1"], "--seed"),
    Case("load-slo", ["load", *TRITON, "--slo-ms", "soon"], "--slo-ms"),
    Case(
        "load-duration-huge",
        ["load", *TRITON, "--duration", "1e7", "--base-qps", "1e4"],
        "--duration",
    ),
    Case(
        "load-output-trace",
        ["load", *TRITON, "--pattern", "trace", "--trace", "trace.txt", "--output", "trace.txt"],
        "--output",
    ),
    Case(
        "serve-metrics-url",
        ["serve", *POLICY, *TRITON, "--metrics", "file:///etc/passwd"],
        "--metrics",
    ),
    Case("serve-metrics-count", ["serve", *POLICY, "--triton", "a:1,b:2", *METRICS], "--metrics"),
    Case("serve-duration", ["serve", *POLICY, *TRITON, *METRICS, "--duration", "-1"], "--duration"),
    Case("serve-policy-missing", ["serve", "--policy", "nope.yaml", *TRITON, *METRICS], "--policy"),
    Case(
        "serve-policy-slo",
        ["serve", *POLICY, *TRITON, *METRICS],
        "--policy",
        replace("policy.yaml", "latencyMs: 800", "latencyMs: 5"),
    ),
    # ---------------------------------------------------------------- demo, job, crds, operator
    Case("demo-tau", ["demo", "--search-only", "--tau", "2"], "--tau"),
    Case("demo-seed", ["demo", "--search-only", "--seed", "-1"], "--seed"),
    Case("demo-output-whole", ["demo", "--output", "r.json"], "--output"),
    Case("job-role", ["job", "bogus", "--state", "cm"], "role"),
    Case("job-state-missing", ["job", "search"], "--state"),
    Case("crds-unknown-flag", ["crds", "--bogus"], "--bogus"),
    Case("operator-unknown-flag", ["operator", "--bogus"], "--bogus"),
    Case("unknown-command", ["bogus"], "bogus"),
]


def inputs(directory: Path) -> None:
    """The good input files every case starts from."""
    (directory / "space.yaml").write_text(SPACE_YAML, encoding="utf-8")
    write_jsonl(directory / "replay.jsonl", ledger_lines())
    (directory / "profiles.json").write_text(json.dumps({"profiles": PROFILES}), encoding="utf-8")
    feasible = {"feasible": [{"config": {"model": "large", "k": 1}, "accuracy": 0.9}]}
    (directory / "result.json").write_text(json.dumps(feasible), encoding="utf-8")
    (directory / "trace.txt").write_text("0.1\n0.2\n", encoding="utf-8")
    with contextlib.redirect_stdout(io.StringIO()):
        argv = ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--output", "policy.yaml"]
        assert main(argv) == 0


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@dataclass(frozen=True)
class Outcome:
    """What one case did: exit code, output, and how it is classified."""

    code: int | None
    out: str
    err: str
    changed: list[str]

    @property
    def kind(self) -> str:
        """clear (one line, exit 2, no file changed), traceback, silent (exit 0) or unclear."""
        if self.code is None or "Traceback" in self.out + self.err:
            return "traceback"
        if self.code == 0:
            return "silent"
        if self.code == 2 and len(self.err.splitlines()) == 1 and not self.changed:
            return "clear"
        return "unclear"


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        previous = Path.cwd()
        os.chdir(name)
        try:
            yield Path(name)
        finally:
            os.chdir(previous)


def attempt(case: Case, directory: Path) -> Outcome:
    """Run one case in directory (the cwd, holding the inputs)."""
    if case.spoil is not None:
        case.spoil(directory)
    before = snapshot(directory)
    out, err = io.StringIO(), io.StringIO()
    code: int | None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(case.argv)
        except BaseException:  # a traceback is what the corpus is looking for
            traceback.print_exc()
            code = None
    after = snapshot(directory)
    changed = [name for name in before if after.get(name) != before[name]]
    return Outcome(code, out.getvalue(), err.getvalue(), changed)


def corpus_counts() -> Counter[str]:
    """Run every case; counts of tried, clear, traceback, silent and unclear."""
    counts: Counter[str] = Counter()
    for case in CASES:
        with workdir() as directory:
            inputs(directory)
            counts[attempt(case, directory).kind] += 1
        counts["tried"] += 1
    return counts


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_line(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2, one stderr line naming the flag or field, no traceback, inputs untouched."""
    monkeypatch.chdir(tmp_path)
    inputs(tmp_path)
    outcome = attempt(case, tmp_path)
    assert "Traceback" not in outcome.out + outcome.err, outcome.err
    assert outcome.code == 2, outcome.err
    lines = outcome.err.splitlines()
    assert len(lines) == 1, outcome.err
    assert case.needle in lines[0], lines[0]
    assert not outcome.changed


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)


if __name__ == "__main__":
    counts = corpus_counts()
    print(
        " ".join(f"{k} {counts[k]}" for k in ("tried", "clear", "traceback", "silent", "unclear"))
    )
