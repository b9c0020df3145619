"""A corpus of bad input for every `compass` subcommand (issue 15 part 9, the CLI half; issue 46).

Each case must exit 2 with exactly one stderr line naming the flag or field, no traceback, and
leave every input file as it was; a case that fails at run time (a broken scoring command) exits
1 with its error on the first line instead. Each runs under a time and memory bound, so that a
hang or a runaway read is counted, not waited for. `python tests/unit/test_cli_corpus.py` prints
the counts (tried, clear, traceback, silent, hang, unclear).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import stat
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_inputs import PROFILES, SPACE_YAML, ledger_lines, write_jsonl

from compass.commands.main import main
from compass.evaluators.ledger import LedgerLock

HUGE = "9" * 400
SPACE = ["--space", "space.yaml"]
LIVE = [*SPACE, "--command", "true", "--samples", "10"]
REPLAY = ["--replay", "replay.jsonl"]
POLICY = ["--policy", "policy.yaml"]
TRITON = ["--triton", "localhost:1"]
RESULT_OUTPUT = ["--result", "result.json", "--output", "p.json"]
METRICS = ["--metrics", "http://localhost:2/metrics"]


@dataclass(frozen=True)
class Case:
    """One bad invocation: argv, what the error line must name, and how to spoil an input."""

    name: str
    argv: list[str]
    needle: str
    spoil: Callable[[Path], None] | None = None
    extra: dict[str, str] = field(default_factory=dict)
    code: int = 2


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


def hardlink(name: str, target: str) -> Callable[[Path], None]:
    def spoil(directory: Path) -> None:
        os.link(directory / target, directory / name)

    return spoil


def fifo(name: str) -> Callable[[Path], None]:
    def spoil(directory: Path) -> None:
        os.mkfifo(directory / name)

    return spoil


def device(name: str) -> Callable[[Path], None]:
    """A character device like /dev/full (1, 7) where mknod is allowed (root), else a FIFO."""

    def spoil(directory: Path) -> None:
        try:
            os.mknod(directory / name, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        except PermissionError:
            os.mkfifo(directory / name)

    return spoil


def alias_bomb(levels: int = 9) -> str:
    """YAML "billion laughs": 9 ** levels strings from a few hundred bytes."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


def many_profiles(count: int) -> str:
    """A profiles file whose Pareto front has ``count`` members."""
    profiles = []
    for i in range(count):
        mean = 50 + i * 0.1
        profiles.append(
            {
                "config": {"k": i},
                "accuracy": 0.3 + 0.6 * i / count,
                "latency_mean_ms": mean,
                "latency_p50_ms": mean,
                "latency_p95_ms": mean * 1.2,
                "latency_p99_ms": mean * 1.3,
                "latency_std_ms": 5,
            }
        )
    return json.dumps({"profiles": profiles})


def _refifo(directory: Path, name: str) -> None:
    """Replace an input file by a FIFO no one writes to: opening it to read would block."""
    (directory / name).unlink()
    os.mkfifo(directory / name)


# Locks held by a case's spoiler (another search on the same ledger), released after it.
_HELD: list[LedgerLock] = []


def held_ledger(link: Callable[[str, str], Callable[[Path], None]]) -> Callable[[Path], None]:
    """An empty checkpoint run.jsonl that another search holds, and r2.jsonl linked to it."""

    def spoil(directory: Path) -> None:
        (directory / "run.jsonl").write_text("", encoding="utf-8")
        link("r2.jsonl", "run.jsonl")(directory)
        lock = LedgerLock(directory / "run.jsonl")
        lock.acquire()
        _HELD.append(lock)

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
    Case(
        "profile-max-seconds-zero",
        ["profile", *TRITON, "--result", "result.json", "--output", "p.json", "--max-seconds", "0"],
        "--max-seconds",
    ),
    Case(
        "profile-second-address-bad",
        ["profile", "--triton", "localhost:1,localhost:99999999", *RESULT_OUTPUT],
        "--triton",
    ),
    Case("load-samples", ["load", *TRITON, "--samples", "0"], "--samples"),
    Case("load-tls-cert-alone", ["load", *TRITON, "--triton-cert", "c.pem"], "--triton-key"),
    Case("load-tls-ca-missing", ["load", *TRITON, "--triton-ca", "nope.pem"], "--triton-ca"),
    Case(
        "load-tls-ca-not-pem",
        ["load", *TRITON, "--triton-ca", "ca.pem"],
        "--triton-ca",
        write("ca.pem", "not a certificate\n"),
    ),
    Case(
        "load-tls-ca-fifo",
        ["load", *TRITON, "--triton-ca", "ca.pem"],
        "--triton-ca",
        fifo("ca.pem"),
    ),
    Case(
        "load-tls-server-name",
        ["load", *TRITON, "--triton-server-name", "bad name!"],
        "--triton-server-name",
    ),
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
    Case("demo-late-binding-alone", ["demo", "--late-binding"], "--late-binding"),
    Case(
        "demo-late-binding-prometheus",
        ["demo", "--cluster", "--late-binding", "--queue-from", "prometheus"],
        "--queue-from",
    ),
    Case("demo-binding-lag-alone", ["demo", "--binding-lag", "0.5"], "--binding-lag"),
    Case("demo-whole-workflow-alone", ["demo", "--whole-workflow"], "--whole-workflow"),
    Case(
        "demo-whole-workflow-late-binding",
        ["demo", "--cluster", "--whole-workflow", "--late-binding"],
        "--whole-workflow",
    ),
    Case(
        "demo-whole-workflow-binding-lag",
        ["demo", "--cluster", "--whole-workflow", "--binding-lag", "0.5"],
        "--binding-lag",
    ),
    Case(
        "demo-binding-prometheus",
        ["demo", "--cluster", "--queue-from", "prometheus"],
        "--queue-from",
    ),
    Case(
        "demo-binding-lag-range",
        ["demo", "--cluster", "--late-binding", "--binding-lag", "1.5"],
        "--binding-lag",
    ),
    Case(
        "demo-binding-lag-reserve",
        ["demo", "--cluster", "--late-binding", "--binding-lag-reserve", "-1"],
        "--binding-lag-reserve",
    ),
    Case("job-role", ["job", "bogus", "--state", "cm"], "role"),
    Case("job-state-missing", ["job", "search"], "--state"),
    Case("crds-unknown-flag", ["crds", "--bogus"], "--bogus"),
    Case("operator-unknown-flag", ["operator", "--bogus"], "--bogus"),
    Case("unknown-command", ["bogus"], "bogus"),
    # ---------------------------------------------------------------- issue 46: no hang, no traceback
    Case("replay-dev-zero", search("--replay", "/dev/zero", "--tau", ".5"), "--replay"),
    Case("replay-fifo", search("--replay", "p.jsonl", "--tau", ".5"), "--replay", fifo("p.jsonl")),
    Case(
        "replay-deep-json",
        search(*REPLAY, "--tau", ".5"),
        "--replay",
        write("replay.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
    ),
    Case("space-fifo", search(*LIVE, "--tau", ".5"), "--space", lambda d: _refifo(d, "space.yaml")),
    Case(
        "space-alias-bomb",
        search(*LIVE, "--tau", ".5"),
        "--space",
        write("space.yaml", alias_bomb()),
    ),
    Case(
        "space-alias-cycle",
        search(*LIVE, "--tau", ".5"),
        "--space",
        write("space.yaml", "parameters: &p [*p]\n"),
    ),
    Case(
        "space-deep-json",
        search("--space", "s.json", "--command", "true", "--samples", "9", "--tau", ".5"),
        "--space",
        write("s.json", "[" * 990 + "]" * 990),
    ),
    Case(
        "policy-alias-bomb", ["simulate", *POLICY], "--policy", write("policy.yaml", alias_bomb())
    ),
    Case(
        "plan-profiles-front-too-long",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "100000", "--output", "o.yaml"],
        "--profiles",
        write("profiles.json", many_profiles(1100)),
    ),
    Case(
        "simulate-trace-binary",
        ["simulate", *POLICY, "--pattern", "trace", "--trace", "trace.txt"],
        "--trace",
        lambda d: (d / "trace.txt").write_bytes(bytes(range(256)) * 8),
    ),
    Case(
        "simulate-trace-1e12",
        ["simulate", *POLICY, "--pattern", "trace", "--trace", "trace.txt"],
        "--trace",
        write("trace.txt", "0\n1e12\n"),
    ),
    Case(
        "simulate-trace-1e300",
        ["simulate", *POLICY, "--pattern", "trace", "--trace", "trace.txt"],
        "--trace",
        write("trace.txt", "0\n1e300\n"),
    ),
    Case(
        "load-trace-1e12",
        ["load", *TRITON, "--pattern", "trace", "--trace", "trace.txt"],
        "--trace",
        write("trace.txt", "0\n1e12\n"),
    ),
    Case(
        "simulate-duration-long-sparse",
        ["simulate", *POLICY, "--duration", "1e7", "--base-qps", "1e-6"],
        "--duration",
    ),
    Case(
        "simulate-no-requests",
        ["simulate", *POLICY, "--duration", "1", "--base-qps", "0.001"],
        "no request",
    ),
    Case(
        "load-no-requests",
        ["load", *TRITON, "--duration", "1", "--base-qps", "0.001"],
        "no request",
    ),
    Case(
        "search-command-huge-number",
        search(
            *SPACE,
            "--command",
            "python3 -c 'print(\"1\" * 50_000_000)'",
            "--samples",
            "10",
            "--tau",
            ".5",
        ),
        "evaluator command python3 failed",
        code=1,
    ),
    # ---------------------------------------------------------------- issue 46: unsafe writes
    Case(
        "plan-output-hardlink",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--output", "out.yaml"],
        "--output",
        hardlink("out.yaml", "profiles.json"),
    ),
    Case(
        "simulate-timeline-hardlink",
        ["simulate", *POLICY, "--timeline", "t.json"],
        "--timeline",
        hardlink("t.json", "policy.yaml"),
    ),
    Case(
        "plan-output-symlink-elsewhere",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--output", "out.yaml"],
        "--output",
        symlink("out.yaml", "result.json"),
    ),
    Case(
        "simulate-timeline-symlink-elsewhere",
        ["simulate", *POLICY, "--timeline", "t.json"],
        "--timeline",
        symlink("t.json", "result.json"),
    ),
    Case(
        "search-output-device",
        search(*REPLAY, "--tau", ".5", "--output", "full"),
        "--output",
        device("full"),
    ),
    Case(
        "plan-output-device",
        ["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--output", "full"],
        "--output",
        device("full"),
    ),
    Case(
        "resume-through-symlink-while-held",
        search(*REPLAY, "--tau", ".5", "--resume", "r2.jsonl"),
        "--resume",
        held_ledger(symlink),
    ),
    Case(
        "resume-through-hardlink-while-held",
        search(*REPLAY, "--tau", ".5", "--resume", "r2.jsonl"),
        "--resume",
        held_ledger(hardlink),
    ),
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
    """Every regular file's bytes, and what any other entry is (a device, a FIFO, a link)."""
    found = {}
    for path in sorted(directory.iterdir()):
        mode = path.lstat().st_mode
        if stat.S_ISREG(mode):
            found[path.name] = path.read_bytes()
        else:
            found[path.name] = f"mode {stat.S_IFMT(mode):o} -> {os.path.realpath(path)}".encode()
    return found


@dataclass(frozen=True)
class Outcome:
    """What one case did: exit code, output, and how it is classified."""

    code: int | None
    out: str
    err: str
    changed: list[str]
    hung: bool = False
    expected: int = 2

    @property
    def kind(self) -> str:
        """clear (exit 2 and one line, or the expected 1 with the error first; no file
        changed), hang (past the time bound), traceback, silent (exit 0) or unclear."""
        if self.hung:
            return "hang"
        if self.code is None or "Traceback" in self.out + self.err:
            return "traceback"
        if self.code == 0:
            return "silent"
        lines = self.err.splitlines()
        one_line = len(lines) == 1 if self.expected == 2 else bool(lines)
        if self.code == self.expected and one_line and not self.changed:
            return "clear"
        return "unclear"


# A case's bounds: a hang is any case past HANG_S; reading past the memory bound raises
# MemoryError (a traceback) instead of swapping the machine.
HANG_S = 30
MEMORY_BYTES = 3 * 1024**3


class Hang(BaseException):
    """Raised by the alarm when a case runs past HANG_S."""


def _on_alarm(signum: int, frame: object) -> None:
    raise Hang


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """Run the body under an alarm (HANG_S) and an address-space cap (MEMORY_BYTES above now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        in_use = int(statm.read().split()[0]) * resource.getpagesize()
    cap = in_use + MEMORY_BYTES
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


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
    code: int | None = None
    hung = False
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with bounded():
                    code = main(case.argv)
            except Hang:
                hung = True
            except BaseException:  # a traceback is what the corpus is looking for
                traceback.print_exc()
                code = None
        after = snapshot(directory)
    finally:
        while _HELD:
            _HELD.pop().release()
    changed = [name for name in before if after.get(name) != before[name]]
    return Outcome(code, out.getvalue(), err.getvalue(), changed, hung, case.code)


def corpus_counts(only: frozenset[str] = frozenset()) -> Counter[str]:
    """Run every case (or those named); counts of tried, clear, traceback, silent, hang and
    unclear. Each case that is not clear is named on stderr with its kind."""
    counts: Counter[str] = Counter()
    for case in CASES:
        if only and case.name not in only:
            continue
        with workdir() as directory:
            inputs(directory)
            kind = attempt(case, directory).kind
        if kind != "clear":
            print(f"{case.name}: {kind}", file=sys.stderr)
        counts[kind] += 1
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
    assert not outcome.hung, f"past {HANG_S} s"
    assert "Traceback" not in outcome.out + outcome.err, outcome.err
    assert outcome.code == case.code, outcome.err
    lines = outcome.err.splitlines()
    if case.code == 2:
        assert len(lines) == 1, outcome.err
    assert case.needle in lines[0], lines[0]
    assert not outcome.changed


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)


if __name__ == "__main__":
    counts = corpus_counts(frozenset(sys.argv[1:]))
    print(
        " ".join(
            f"{k} {counts[k]}" for k in ("tried", "clear", "traceback", "silent", "hang", "unclear")
        )
    )
