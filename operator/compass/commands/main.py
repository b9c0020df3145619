"""The `compass` command line: search a configuration space, or run the embedded demo."""

# E402: numpy and scipy must be loaded by _load_numerics_single_threaded() before anything
# imports them, so the imports after that call are not at the top.
# ruff: noqa: E402

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _load_numerics_single_threaded() -> None:
    """Load numpy's and scipy's BLAS with one thread unless the user set a count."""
    saved = {name: os.environ.get(name) for name in _BLAS_THREAD_VARIABLES}
    for name in _BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, "1")
    try:
        import numpy
        import scipy.stats  # loads scipy's own BLAS, separate from numpy's

        del numpy, scipy
    finally:
        # A --command evaluator inherits the environment and should keep every thread.
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)


# The search's matrices are about 100 x 100: BLAS threads only contend for the cores (the demo
# ran 5x slower on a busy 2-core machine). BLAS reads these variables once, when loaded.
_load_numerics_single_threaded()

import yaml
from pydantic import ValidationError

from compass.commands import load, operator, plan, profile, serve, simulate
from compass.console import Parser, UsageError, fail, parse_int, parse_number, search_with_progress
from compass.domain.evaluation import EvaluationError, Evaluator, ParamValue
from compass.domain.search import (
    SearchMethod,
    SearchOutcome,
    SearchSettings,
)
from compass.domain.space import Space, SpaceError, SpaceSpec, config_key, explain_validation_error
from compass.domain.statistics import IntervalMethod, StoppingRule
from compass.evaluators import (
    CheckpointedEvaluator,
    CheckpointLedger,
    Ledger,
    LedgerError,
    ReplayEvaluator,
    ScoreSource,
    make_evaluator,
    read_ledger,
)
from compass.examples import RAG_PAPER_SAMPLES, build_replay_ledger, load_rag_paper

DEFAULT_BUDGETS = (10, 25, 50, 100)
DEFAULT_LEDGER = "compass-search.ledger.jsonl"
DEMO_LEDGER_SEED = 0
SHOWN_FEASIBLE = 10
# Redrawing the progress line more often than this only costs terminal time.

# The fix to suggest for pydantic errors whose message does not carry one.
_PYDANTIC_FIXES = {
    "missing": "add it",
    "too_short": "give at least one",
    "extra_forbidden": "remove it or fix its spelling",
    "enum": "use one of those",
    "literal_error": "use one of those",
    "string_pattern_mismatch": "start with a letter or _ and use only letters, digits and _",
    "string_too_long": "shorten it",
}


# ---------------------------------------------------------------------------- parsing


def _add_settings(parser: argparse.ArgumentParser, tau_default: str | None) -> None:
    """Options shared by `search` and `demo`: what the search looks for and how."""
    if tau_default is None:
        parser.add_argument(
            "--tau", required=True, help="accuracy target in (0, 1]: find every config >= it"
        )
    else:
        parser.add_argument(
            "--tau", default=tau_default, help=f"accuracy target in (0, 1] (default {tau_default})"
        )
    parser.add_argument(
        "--budgets",
        help="comma-separated, strictly increasing sample counts at which a configuration is "
        "judged (default 10,25,50,100, capped at the dataset size)",
    )
    parser.add_argument(
        "--confidence", default="0.95", help="confidence of each verdict (default 0.95)"
    )
    parser.add_argument("--seed", default="0", help="seed of the sample order and the search")
    parser.add_argument(
        "--method",
        choices=[m.value for m in SearchMethod],
        default=SearchMethod.COMPASS_V.value,
        help="compass-v (default) or grid (every configuration, with early stopping)",
    )
    parser.add_argument(
        "--interval",
        choices=[m.value for m in IntervalMethod],
        default=IntervalMethod.WILSON.value,
        help="early-stopping test (default wilson)",
    )
    parser.add_argument("--output", metavar="RESULT.json", help="write the result JSON here")


def build_parser() -> argparse.ArgumentParser:
    """The `compass` argument parser with its subcommands."""
    parser = Parser(
        prog="compass",
        description="Find every configuration of a compound-AI workflow that reaches an "
        "accuracy target, evaluating as few samples as possible.",
    )
    commands = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    run = commands.add_parser(
        "search",
        help="search a configuration space",
        description="Search a configuration space for every configuration whose accuracy is "
        ">= tau. Scores come from a replay ledger (--replay) or from your own command "
        "(--command). Every evaluated batch is appended to a checkpoint ledger, so an "
        "interrupted run continues with --resume.",
    )
    run.add_argument("--space", help="space file (YAML or JSON: parameters and constraints)")
    run.add_argument(
        "--replay",
        metavar="LEDGER",
        help='JSONL ledger of recorded scores, one {"config": ..., "scores": [...]} a line',
    )
    run.add_argument(
        "--command",
        metavar='"CMD ARGS"',
        help="command that scores a configuration: reads "
        '{"config": ..., "samples": [...]} on stdin, prints a JSON list of scores',
    )
    run.add_argument(
        "--triton",
        metavar="HOST:PORT",
        help="score live through the Triton router (gRPC) with a per-request configuration",
    )
    run.add_argument("--router", default="router", help="router model name (with --triton)")
    run.add_argument("--samples", metavar="N", help="dataset size (with --command or --triton)")
    run.add_argument(
        "--ledger",
        metavar="PATH",
        help=f"checkpoint ledger (default: next to --output, else ./{DEFAULT_LEDGER})",
    )
    run.add_argument("--resume", metavar="LEDGER", help="continue the run checkpointed in LEDGER")
    _add_settings(run, tau_default=None)
    run.set_defaults(handler=_search_command)

    demo = commands.add_parser(
        "demo",
        help="the whole method on this machine: search, profile, plan, serve a spike (minutes)",
        description="Start a real tritonserver serving rag-sim (the paper's RAG workflow: 234 "
        "configurations with the paper's measured accuracy and latency), run COMPASS-V through "
        "its router, profile the feasible configurations, plan, and serve a seeded load spike "
        "with the static fastest, the static most accurate and Elastico; tables on stdout, "
        "files and plots in --output-dir. --search-only runs the search alone on the embedded "
        "replay (seconds, no Triton).",
    )
    # 0.75: the accuracy floor of the paper's own planning and serving runs.
    _add_settings(demo, tau_default="0.75")
    demo.add_argument(
        "--search-only",
        action="store_true",
        help=f"only the search, replaying the embedded grid in memory ({RAG_PAPER_SAMPLES} "
        "samples a configuration); --output writes its result",
    )
    demo.add_argument(
        "--output-dir", default="compass-demo", help="where the demo writes (default compass-demo)"
    )
    demo.add_argument(
        "--cluster",
        action="store_true",
        help="the same through the operator: a local Kubernetes API server (hack/k8s/build.sh's "
        "binaries), `compass operator`, `kubectl apply` of examples/rag-sim-workflow.yaml (its "
        "own tau and budgets; the search replays rag-sim's scores), the spike served by the "
        "operator's policy and by the most accurate configuration (a few minutes)",
    )
    demo.add_argument(
        "--time-scale",
        help="rag-sim serves its latencies times this; the load, SLO and cooldowns follow "
        "(default 0.2: the 180 s spike runs in 36 s; 0.1 with --cluster)",
    )
    demo.add_argument("--slo-ms", default="1000", help="p95 latency SLO, ms (default 1000)")
    demo.add_argument(
        "--base-qps",
        help="load before and after the spike (default: the paper's 1.5 QPS relative to this "
        "machine: the spike peaks at 77%% of the fastest configuration's capacity)",
    )
    demo.add_argument("--duration", default="180", help="seconds of load (default 180)")
    demo.add_argument(
        "--profile-runs",
        help="measured requests per configuration (default 30; 20 with --cluster)",
    )
    demo.set_defaults(handler=_demo_command)
    profile.register(commands)
    load.register(commands)
    serve.register(commands)
    plan.register(commands)
    simulate.register(commands)
    operator.register(commands)  # `compass operator`; kopf is imported only when it runs

    crds = commands.add_parser(
        "crds",
        help="write the CustomResourceDefinition YAML generated from the models",
        description="Render the compass.io CRDs from their pydantic models (the single source "
        "of truth) into a directory; --check only reports whether the files there are current.",
    )
    crds.add_argument("--output-dir", default="crds", help="where to write (default: crds)")
    crds.add_argument("--check", action="store_true", help="fail if the files are stale")
    crds.add_argument(
        "--without-cel",
        action="store_true",
        help="leave out the CEL rules (x-kubernetes-validations), for Helm 4 on Kubernetes < 1.25",
    )
    crds.add_argument(
        "--reference",
        metavar="FILE",
        help="also write (with --check: verify) the markdown CRD reference rendered from the "
        "same models, e.g. docs/crd-reference.md (always with the CEL rules)",
    )
    crds.set_defaults(handler=_crds_command)

    job = commands.add_parser(
        "job",
        help="run inside the operator's Jobs (search or profile a CompoundWorkflow)",
        description="What the search and profiling Jobs run: read the workflow spec and the "
        "ledger from the state ConfigMap (namespace from $COMPASS_NAMESPACE), resume, and write "
        "the ledger, the progress and the result back to it.",
    )
    job.add_argument("role", choices=["search", "profile"], help="which Job this is")
    job.add_argument("--state", required=True, metavar="CONFIGMAP", help="the state ConfigMap")
    job.set_defaults(handler=_job_command)
    return parser


def _job_command(args: argparse.Namespace) -> int:
    """`compass job search|profile --state NAME`."""
    from compass.commands import job as jobrun

    return jobrun.main(str(args.role), str(args.state))


def _crds_command(args: argparse.Namespace) -> int:
    """`compass crds`: write or check the generated CRD YAML."""
    from compass.api.crds import render_crds

    directory = Path(str(args.output_dir))
    if not directory.is_dir():
        fail("--output-dir", f"{directory} is not a directory", "create it or pass another")
    stale = []
    for name, text in render_crds(cel=not args.without_cel).items():
        path = directory / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            _write_atomic(path, text)
    reference_stale = args.reference is not None and _crd_reference(
        Path(str(args.reference)), write=not args.check
    )
    if args.check and (stale or reference_stale):
        if stale:
            print(
                f"compass crds: stale in {directory}: {', '.join(stale)}; run `compass crds "
                f"{'--without-cel ' if args.without_cel else ''}--output-dir {directory}` and "
                "commit the result",
                file=sys.stderr,
            )
        if reference_stale:
            print(
                f"compass crds: stale: {args.reference}; run `compass crds --reference "
                f"{args.reference}` (hack/gen-crds.sh does) and commit the result",
                file=sys.stderr,
            )
        return 1
    verb = "up to date" if not stale else f"wrote {', '.join(stale)}"
    print(f"compass crds: {directory}: {verb}")
    if args.reference is not None:
        done = "wrote it" if reference_stale else "up to date"
        print(f"compass crds: {args.reference}: {done}")
    return 0


def _crd_reference(path: Path, *, write: bool) -> bool:
    """Whether the CRD reference at path is stale; rewritten when write is set."""
    from compass.api.reference import render_reference

    if not path.parent.is_dir():
        fail("--reference", f"{path.parent} is not a directory", "create it or pass another")
    text = render_reference()
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    if write:
        _write_atomic(path, text)
    return True


def _parse_float(field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        fail(field, f"{text!r} is not a number", f"pass a number, e.g. {field} 0.8")
    return value


def _parse_budgets(text: str) -> tuple[int, ...]:
    """Comma-separated budgets, checked for shape; the dataset size is checked later."""
    fix = "pass comma-separated sample counts, smallest first, e.g. --budgets 10,25,50,100"
    budgets = []
    for part in text.split(","):
        try:
            budgets.append(int(part.strip()))
        except ValueError:
            fail("--budgets", f"{part.strip()!r} is not an integer", fix)
    if budgets[0] < 1:
        fail("--budgets", f"{budgets[0]} is below 1", fix)
    for before, after in itertools.pairwise(budgets):
        if after <= before:
            fail("--budgets", f"{text} is not strictly increasing ({before} then {after})", fix)
    return tuple(budgets)


def _resolve_budgets(
    given: tuple[int, ...] | None, population: int, source: str
) -> tuple[int, ...]:
    """The budgets to use: the given ones if they fit the dataset, else the capped defaults."""
    if given is None:
        # Small datasets still get a schedule: the defaults below N, then N itself.
        return tuple(
            sorted(
                {b for b in DEFAULT_BUDGETS if b < population}
                | {min(population, DEFAULT_BUDGETS[-1])}
            )
        )
    if given[-1] > population:
        fail(
            "--budgets",
            f"{given[-1]} is above the dataset size {population} ({source})",
            f"keep every budget <= {population}",
        )
    return given


@dataclass(frozen=True)
class _Settings:
    """Parsed options common to both commands, before the dataset size is known."""

    tau: float
    budgets: tuple[int, ...] | None
    confidence: float
    seed: int
    method: SearchMethod
    interval: IntervalMethod
    output: Path | None

    def search_settings(self, budgets: tuple[int, ...]) -> SearchSettings:
        """The domain settings, once the budgets are resolved."""
        return SearchSettings(
            tau=self.tau,
            budgets=budgets,
            confidence=self.confidence,
            seed=self.seed,
            method=self.method,
            interval=self.interval,
        )


def _parse_settings(args: argparse.Namespace) -> _Settings:
    tau = _parse_float("--tau", str(args.tau))
    if not 0 < tau <= 1:
        fail(
            "--tau",
            f"{args.tau} is outside (0, 1]",
            "pass the target accuracy as a fraction, e.g. --tau 0.8",
        )
    confidence = _parse_float("--confidence", str(args.confidence))
    if not 0 < confidence < 1:
        fail("--confidence", f"{args.confidence} is outside (0, 1)", "pass e.g. --confidence 0.95")
    output = None if args.output is None else Path(str(args.output))
    if output is not None:
        if output.is_dir():
            fail("--output", f"{output} is a directory", "name a file, e.g. --output result.json")
        if not output.parent.is_dir():
            fail(
                "--output",
                f"directory {output.parent} does not exist",
                "create it first or choose another path",
            )
    return _Settings(
        tau=tau,
        budgets=None if args.budgets is None else _parse_budgets(str(args.budgets)),
        confidence=confidence,
        seed=parse_int("--seed", str(args.seed), "0"),
        method=SearchMethod(args.method),
        interval=IntervalMethod(args.interval),
        output=output,
    )


# ---------------------------------------------------------------------------- inputs


def _explain_pydantic(error: ValidationError) -> str:
    """explain_validation_error, with a fix appended when pydantic's message has none."""
    message = explain_validation_error(error)
    if "; " not in message:
        kind = str(error.errors()[0].get("type", ""))
        message += f"; {_PYDANTIC_FIXES.get(kind, 'fix the space file')}"
    return message


def _load_space(path: Path) -> Space:
    """Read and validate a space file; any problem is a UsageError naming the file."""
    field = f"--space {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail("--space", f"{path}: no such file", "check the path")
    except (OSError, UnicodeDecodeError) as exc:
        fail("--space", f"{path}: cannot read it ({exc})", "check the path")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        fail(f"{field}{where}", f"not valid YAML or JSON ({problem})", "fix the syntax")
    prefix = ""
    if isinstance(data, dict) and isinstance(data.get("spec"), dict) and "space" in data["spec"]:
        # A whole CompoundWorkflow manifest: its spec.space is the space.
        data, prefix = data["spec"]["space"], "spec.space."
    if not isinstance(data, dict):
        fail(
            field,
            f"expected a mapping with parameters and constraints, got {type(data).__name__}",
            "write parameters: [...] and constraints: [...] at the top level",
        )
    try:
        spec = SpaceSpec.model_validate(data)
    except ValidationError as exc:
        message = _explain_pydantic(exc)
        raise UsageError(f"{field}: {prefix}{message}") from None
    try:
        return Space(spec)
    except SpaceError as exc:
        raise UsageError(f"{field}: {exc}") from None


@dataclass(frozen=True)
class _ReplayLine:
    """Where one replay-ledger line is, and what it holds."""

    number: int
    config: dict[str, ParamValue]
    samples: list[int]


def _replay_lines(path: Path) -> list[_ReplayLine]:
    """The lines of a ledger that read_ledger has already validated, with their numbers."""
    found = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            # read_ledger accepted the file, so this is the torn final line it dropped.
            break
        scores = obj["scores"]
        samples = obj.get("samples", list(range(len(scores))))
        found.append(_ReplayLine(number, obj["config"], [int(i) for i in samples]))
    return found


@dataclass
class _Replay:
    """A validated replay ledger and the dataset size it implies."""

    ledger: Ledger
    population: int
    budgets: tuple[int, ...]
    space: Space
    inferred: bool


def _load_replay(path: Path, space: Space | None, given: tuple[int, ...] | None) -> _Replay:
    """Read a replay ledger, check it against the budgets and the space (or infer the space)."""
    try:
        ledger = read_ledger(path)
    except LedgerError as exc:
        raise UsageError(f"--replay: {exc}") from None
    lines = _replay_lines(path)
    if not lines:
        fail(
            "--replay",
            f"{path} holds no scores",
            'write one {"config": ..., "scores": [...]} a line',
        )
    longest = max(lines, key=lambda line: len(line.samples))
    population = len(longest.samples)
    source = f"scores per line of {path}"
    budgets = _resolve_budgets(given, population, source)
    names = sorted(lines[0].config)
    for line in lines:
        where = f"--replay {path} line {line.number}"
        count = len(line.samples)
        if sorted(line.samples) != list(range(count)):
            fail(
                where,
                f"its samples are not 0..{count - 1}",
                'a replay ledger scores every configuration on samples 0..N-1 (leave "samples" '
                "out to mean 0..len-1)",
            )
        if count < budgets[-1]:
            fail(
                where,
                f"{count} scores, fewer than the largest budget {budgets[-1]}",
                f"record at least {budgets[-1]} samples for every configuration, or lower "
                "--budgets",
            )
        if count != population:
            fail(
                where,
                f"{count} scores, but line {longest.number} has {population}",
                "every line must score the same samples 0..N-1",
            )
        if space is not None:
            try:
                space.index(line.config)
            except SpaceError as exc:
                fail(where, str(exc), "remove the line, or add the configuration to --space")
        elif sorted(line.config) != names:
            fail(
                where,
                f"it sets {', '.join(sorted(line.config))}, line {lines[0].number} sets "
                f"{', '.join(names)}",
                "every configuration must set the same parameters (or pass --space)",
            )
    if space is not None:
        return _Replay(ledger, population, budgets, space, inferred=False)
    try:
        inferred = Space.infer(ledger.configs())
    except SpaceError as exc:
        raise UsageError(f"--replay {path}: {exc}") from None
    return _Replay(ledger, population, budgets, inferred, inferred=True)


def _check_resume(path: Path, space: Space, population: int, replay: Ledger | None) -> int:
    """Check a checkpoint belongs to this search; return how many facts it holds."""
    try:
        facts = read_ledger(path)
    except LedgerError as exc:
        raise UsageError(f"--resume: {exc}") from None
    other = "this checkpoint belongs to another search: pass that search's inputs, or remove it"
    for config in facts.configs():
        key = config_key(config)
        if config not in space:
            fail(f"--resume {path}", f"configuration {key} is not in the space", other)
        scores = facts.scores(config)
        if max(scores, default=-1) >= population:
            fail(
                f"--resume {path}",
                f"configuration {key} has sample {max(scores)} but the dataset has "
                f"{population} samples",
                other,
            )
        if replay is None:
            continue
        recorded = replay.lookup(config, list(scores))
        for (index, score), expected in zip(scores.items(), recorded.tolist(), strict=True):
            if score != expected:
                fail(
                    f"--resume {path}",
                    f"sample {index} of configuration {key} scores {score} here but "
                    f"{expected} in the replay ledger",
                    other,
                )
    return facts.fact_count


# ---------------------------------------------------------------------------- output


def _describe_config(config: Mapping[str, ParamValue]) -> str:
    return " ".join(f"{name}={value}" for name, value in config.items())


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory, so readers never see half a file."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp makes the file private; a result file should get the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _summary(
    outcome: SearchOutcome, settings: SearchSettings, result: Path | None, ledger: str
) -> str:
    """The one-screen report printed at the end of a search."""
    space_size = outcome.space.size
    population = outcome.population
    feasible = outcome.feasible
    lines = [
        f"tau {settings.tau:g}, method {settings.method.value}, interval "
        f"{settings.interval.value} (confidence {settings.confidence:g}), budgets "
        f"{','.join(map(str, settings.budgets))}, seed {settings.seed}",
        f"space: {space_size:,} configurations, {population:,} samples each",
        f"feasible: {len(feasible)} found (accuracy >= {settings.tau:g}); accuracy below is the "
        "mean over the samples evaluated",
    ]
    if feasible:
        lines.append(f"  {'accuracy':>8}  {'samples':>7}  configuration")
        for a in feasible[:SHOWN_FEASIBLE]:
            described = _describe_config(outcome.space.config(a.index))
            lines.append(f"  {a.accuracy:>8.3f}  {a.samples:>7}  {described}")
        if len(feasible) > SHOWN_FEASIBLE:
            where = "with --output RESULT.json" if result is None else f"in {result}"
            lines.append(f"  ... and {len(feasible) - SHOWN_FEASIBLE} more, listed {where}")
    exhaustive = space_size * population
    savings = 1 - outcome.sample_evals / exhaustive
    lines += [
        f"evaluated: {outcome.configs_evaluated:,} of {space_size:,} configurations, "
        f"{outcome.sample_evals:,} sample evaluations",
        f"savings: {savings:.1%} fewer sample evaluations than exhaustive "
        f"({exhaustive:,} = {space_size:,} configurations x {population:,} samples)",
        f"stopped: {outcome.stop_reason}",
        f"result: {result or 'not written (pass --output RESULT.json to keep it)'}",
        f"ledger: {ledger}",
    ]
    return "\n".join(lines)


def _write_result(outcome: SearchOutcome, output: Path | None) -> Path | None:
    """Write the result file if asked; return where it went."""
    if output is not None:
        _write_atomic(output, json.dumps(outcome.result_document(), indent=2) + "\n")
    return output


# ---------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class _Plan:
    """A fully validated search, ready to run; nothing has been written yet."""

    space: Space
    inner: Evaluator
    population: int
    settings: SearchSettings
    checkpoint: Path
    resumed_facts: int | None
    output: Path | None
    notes: tuple[str, ...]


def _checkpoint_path(args: argparse.Namespace, output: Path | None) -> tuple[Path, bool]:
    """The checkpoint ledger's path and whether it continues an earlier run."""
    if args.resume is not None:
        resume = Path(str(args.resume))
        if args.ledger is not None and Path(str(args.ledger)).resolve() != resume.resolve():
            fail(
                "--ledger",
                f"{args.ledger} differs from --resume {resume}",
                "pass only --resume: new batches are appended to the ledger being resumed",
            )
        if not resume.is_file():
            fail(
                "--resume",
                f"{resume}: no such file",
                "check the path, or leave --resume out to start afresh",
            )
        return resume, True
    if args.ledger is not None:
        path = Path(str(args.ledger))
    elif output is not None:
        path = output.with_suffix(".ledger.jsonl")
    else:
        path = Path(DEFAULT_LEDGER)
    if path.exists():
        fail(
            "--ledger", f"{path} exists", f"pass --resume {path} to continue that run, or remove it"
        )
    if not path.parent.is_dir():
        fail(
            "--ledger",
            f"directory {path.parent} does not exist",
            "create it first or choose another path",
        )
    return path, False


def _plan_search(args: argparse.Namespace) -> _Plan:
    """Validate every input of `compass search`; raise UsageError on the first problem."""
    sources = [a for a in ("replay", "command", "triton") if getattr(args, a) is not None]
    if len(sources) != 1:
        what = "neither given" if not sources else f"{' and '.join(sources)} given"
        fail(
            "--replay/--command/--triton",
            what,
            'pass exactly one: --replay LEDGER (recorded scores), --command "CMD ARGS" or '
            "--triton HOST:PORT (score live)",
        )
    settings = _parse_settings(args)
    checkpoint, resuming = _checkpoint_path(args, settings.output)
    if settings.output is not None and settings.output.resolve() == checkpoint.resolve():
        fail("--output", f"{settings.output} is also the checkpoint ledger", "choose another path")
    space = None if args.space is None else _load_space(Path(str(args.space)))
    notes: list[str] = []
    replay: Ledger | None = None
    inner: Evaluator
    if args.replay is not None:
        if args.samples is not None:
            fail(
                "--samples",
                "only used with --command",
                "leave it out: the replay ledger sets the dataset size",
            )
        replay_path = Path(str(args.replay))
        if replay_path.resolve() == checkpoint.resolve():
            fail(
                "--ledger",
                f"{checkpoint} is the --replay ledger",
                "give the checkpoint its own file",
            )
        loaded = _load_replay(replay_path, space, settings.budgets)
        space, population, budgets, replay = (
            loaded.space,
            loaded.population,
            loaded.budgets,
            loaded.ledger,
        )
        if loaded.inferred:
            notes.append(
                f"no --space given: inferred the space from the {len(replay):,} configurations "
                f"in {replay_path} (pass --space to search beyond them):\n{space.describe()}"
            )
        else:
            absent = sum(1 for i in range(space.size) if space.config(i) not in replay)
            if absent:
                notes.append(
                    f"note: {replay_path} has no scores for {absent:,} of the space's "
                    f"{space.size:,} configurations; the search stops with an error if it "
                    "needs one"
                )
        inner = make_evaluator(ScoreSource(replay=replay))
    else:
        live = "--command" if args.command is not None else "--triton"
        if space is None:
            fail("--space", f"required with {live}", "pass --space SPACE.yaml")
        if args.samples is None:
            fail("--samples", f"required with {live}", "pass the dataset size, e.g. --samples 100")
        population = parse_int("--samples", str(args.samples), "100")
        if population < 1:
            fail(
                "--samples", f"{population} is below 1", "pass the dataset size, e.g. --samples 100"
            )
        budgets = _resolve_budgets(settings.budgets, population, "--samples")
        if args.triton is not None:
            inner = make_evaluator(
                ScoreSource(triton=str(args.triton), router_model=str(args.router))
            )
        else:
            argv = shlex.split(str(args.command))
            if not argv:
                fail(
                    "--command",
                    "empty",
                    'pass the program and its arguments, e.g. --command "python score.py"',
                )
            inner = make_evaluator(ScoreSource(command=argv))
    search_settings = settings.search_settings(budgets)
    try:
        StoppingRule(
            tau=search_settings.tau,
            population=population,
            budgets=budgets,
            confidence=search_settings.confidence,
            space_size=space.size,
            method=search_settings.interval,
        )
    except ValueError as exc:
        fail("--budgets", str(exc), "fix the search settings")
    resumed = _check_resume(checkpoint, space, population, replay) if resuming else None
    return _Plan(
        space=space,
        inner=inner,
        population=population,
        settings=search_settings,
        checkpoint=checkpoint,
        resumed_facts=resumed,
        output=settings.output,
        notes=tuple(notes),
    )


def _search_command(args: argparse.Namespace) -> int:
    """`compass search`: validate everything, then search with a checkpoint."""
    prog = "compass search"
    plan = _plan_search(args)
    for note in plan.notes:
        print(f"{prog}: {note}", file=sys.stderr)
    if plan.resumed_facts is not None:
        print(
            f"{prog}: resuming from {plan.checkpoint} ({plan.resumed_facts:,} sample evaluations "
            "recorded)",
            file=sys.stderr,
        )
    try:
        checkpoint = CheckpointLedger(plan.checkpoint)
    except (LedgerError, OSError) as exc:
        fail("--ledger", str(exc), "check the path")
    evaluator = CheckpointedEvaluator(plan.inner, checkpoint)
    resume_hint = f"rerun with --resume {plan.checkpoint} to continue"
    try:
        outcome = search_with_progress(plan.space, evaluator, plan.population, plan.settings)
        result = _write_result(outcome, plan.output)
    except (EvaluationError, LedgerError, OSError) as exc:
        done = checkpoint.ledger.fact_count
        print(f"{prog}: error: {exc}", file=sys.stderr)
        print(
            f"{prog}: {plan.checkpoint} keeps the {done:,} sample evaluations done so far; "
            f"fix the problem and {resume_hint}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {resume_hint}", file=sys.stderr)
        return 130
    if plan.resumed_facts is not None:
        print(
            f"{prog}: reused {evaluator.reused:,} sample evaluations from {plan.checkpoint}; "
            f"evaluated {evaluator.computed:,} new",
            file=sys.stderr,
        )
    ledger = (
        f"{plan.checkpoint} ({evaluator.computed:,} new sample evaluations, "
        f"{evaluator.reused:,} reused)"
    )
    print(_summary(outcome, plan.settings, result, ledger))
    return 0


def demo_ledger() -> tuple[Space, Ledger]:
    """The embedded RAG example as a space and an in-memory replay ledger."""
    spec, rows = load_rag_paper()
    space = Space.from_spec(spec)
    ledger = Ledger("embedded RAG example")
    for line in build_replay_ledger(rows, RAG_PAPER_SAMPLES, DEMO_LEDGER_SEED):
        ledger.add(line["config"], range(len(line["scores"])), line["scores"])
    return space, ledger


def _demo_command(args: argparse.Namespace) -> int:
    """`compass demo`: the whole method on a local Triton, or (--search-only) the search alone."""
    settings = _parse_settings(args)
    budgets = _resolve_budgets(settings.budgets, RAG_PAPER_SAMPLES, "the embedded example")
    search_settings = settings.search_settings(budgets)
    if args.cluster and args.search_only:
        fail("--cluster", "not with --search-only", "pass one of them")
    if not args.search_only:
        from compass.lab.demo import DemoSettings, run_demo

        if settings.output is not None:
            fail("--output", "only with --search-only", "the demo writes into --output-dir")

        def positive(flag: str, example: str, default: str | None = None) -> float:
            text = getattr(args, flag[2:].replace("-", "_"))
            return parse_number(flag, str(text or default), example, low=0, inclusive=False)

        base_qps = None if args.base_qps is None else positive("--base-qps", "1.5")
        if args.cluster:
            from compass.lab.clusterdemo import ClusterDemoSettings, run_cluster_demo

            return run_cluster_demo(
                ClusterDemoSettings(
                    output_dir=Path(str(args.output_dir)),
                    time_scale=positive("--time-scale", "0.1", "0.1"),
                    slo_ms=positive("--slo-ms", "1000"),
                    base_qps=base_qps,
                    duration_s=positive("--duration", "180"),
                    load_seed=search_settings.seed,
                    measured_runs=parse_int(
                        "--profile-runs", str(args.profile_runs or 20), "20", low=2
                    ),
                )
            )
        return run_demo(
            DemoSettings(
                output_dir=Path(str(args.output_dir)),
                search=search_settings,
                time_scale=positive("--time-scale", "0.2", "0.2"),
                slo_ms=positive("--slo-ms", "1000"),
                base_qps=base_qps,
                duration_s=positive("--duration", "180"),
                load_seed=search_settings.seed,
                measured_runs=parse_int(
                    "--profile-runs", str(args.profile_runs or 30), "30", low=2
                ),
            )
        )
    space, ledger = demo_ledger()
    print(
        f"compass demo: the Compass paper's RAG grid ({space.size} configurations; each "
        f"replays its recorded accuracy over {RAG_PAPER_SAMPLES} samples)"
    )
    try:
        outcome = search_with_progress(
            space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, search_settings
        )
        result = _write_result(outcome, settings.output)
    except (EvaluationError, OSError) as exc:
        print(f"compass demo: error: {exc}", file=sys.stderr)
        return 1
    print(_summary(outcome, search_settings, result, "none (the demo replays in memory)"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the `compass` command line; return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"{exc.prog or 'compass'}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except UsageError as exc:
        print(f"compass {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # `search` reports its own interruption with a resume hint; this is everything else.
        print(f"compass {args.subcommand}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
